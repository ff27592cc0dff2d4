from __future__ import annotations

import numpy as np
import pytest

from autosearch import Architecture, InvalidArchitectureError


def test_canonical_json_and_identity_ignore_gene_order():
    a = Architecture(space="resnet", genes={"b": 2, "a": "x"})
    b = Architecture(space="resnet", genes={"a": "x", "b": 2})
    assert a == b and hash(a) == hash(b) and a.arch_id == b.arch_id
    assert a.to_json() == '{"genes":{"a":"x","b":2},"space":"resnet"}'
    assert list(a) == ["a", "b"]
    assert Architecture.from_json(a.to_json()) == a


def test_different_genes_or_space_differ():
    a = Architecture(space="resnet", genes={"a": 1})
    assert a != a.replace(a=2)
    assert a != Architecture(space="other", genes={"a": 1})
    assert a.arch_id != a.replace(a=2).arch_id
    assert len({a, a.replace(a=1), a.replace(a=2)}) == 2


def test_is_immutable_even_through_the_source_dict():
    genes = {"a": 1}
    a = Architecture(space="s", genes=genes)
    genes["a"] = 5
    assert a["a"] == 1
    with pytest.raises(TypeError, match="read-only"):
        a.genes["a"] = 3  # type: ignore[index]
    with pytest.raises(AttributeError):
        a.space = "t"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "could not be parsed"),
        ('{"space": "resnet"}', "exactly the keys"),
        ('{"space": "resnet", "genes": [1, 2]}', "must be an object"),
        ('{"space": "", "genes": {}}', "non-empty"),
        ('{"space": "resnet", "genes": {"a": [1]}}', "gene 'a'"),
        ("[]", "exactly the keys"),
    ],
)
def test_malformed_json_is_refused_with_what_was_expected(text, match):
    with pytest.raises(InvalidArchitectureError, match=match):
        Architecture.from_json(text)


def test_missing_gene_lookup_names_the_genes():
    a = Architecture(space="resnet", genes={"a": 1})
    with pytest.raises(InvalidArchitectureError, match="no gene 'b'; its genes are a"):
        a["b"]


def test_numpy_scalars_are_not_genes():
    with pytest.raises(InvalidArchitectureError):
        Architecture(space="s", genes={"a": np.int64(3)})
