"""Population-based training: a population of one architecture's training runs, its
settings adapted while it trains, shared by every worker that opens its folder.

========================  ==============================================================
``ledger.py``             the population's record in its folder, under a lock
``run.py``                the members trained round by round; exploit and explore;
                          the winner's schedule replayed
========================  ==============================================================

The settings and the explore rule are the training side's
(:mod:`autosearch.training.pbt`).
"""

from autosearch.study.population.run import PopulationResult, replay, train_population

__all__ = ["PopulationResult", "replay", "train_population"]
