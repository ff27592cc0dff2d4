"""Search spaces: the protocol every space writes (:class:`SearchSpace`, with the
:class:`NetworkSpec` of its torch-only network), the gene domains, and the moves and
encodings derived from them. The spaces themselves live in ``search_spaces``."""

from autosearch.space.domains import SIZE_LIMITS, Categorical, Domain, IntRange, check_sizes
from autosearch.space.protocol import NetworkSpec, SearchSpace

__all__ = [
    "SIZE_LIMITS",
    "Categorical",
    "Domain",
    "IntRange",
    "NetworkSpec",
    "SearchSpace",
    "check_sizes",
]
