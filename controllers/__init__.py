"""Controller plugins. Importing this package registers every controller in it."""

from controllers.evolution import RegularizedEvolution
from controllers.local_search import LocalSearch
from controllers.optuna_samplers import GP, NSGA2, TPE, OptunaController, register_sampler
from controllers.random_search import RandomSearch
from controllers.reinforce import Reinforce
from controllers.zero_cost import ZeroCostWarmup

__all__ = [
    "GP",
    "NSGA2",
    "TPE",
    "LocalSearch",
    "OptunaController",
    "RandomSearch",
    "RegularizedEvolution",
    "Reinforce",
    "ZeroCostWarmup",
    "register_sampler",
]
