"""Population-based training: a population of one architecture's training runs, its
settings adapted while it trains, shared by every worker that opens its folder.

========================  ==============================================================
``rules.py``              ``PopulationBasedTraining``: its settings, explore and perturb
``ledger.py``             the population's record in its folder, under a lock
``run.py``                the members trained round by round; exploit and explore;
                          the winner's schedule replayed
``full.py``               an export trained as a population, or by a schedule replayed
``study.py``              a study's architecture trained as a population, as a trial
========================  ==============================================================

The training side is the trainer's ``train(..., until=, adaptive=)``: a run stopped after
an epoch and continued with new settings.
"""

from autosearch.population.run import PopulationResult, replay, train_population

__all__ = ["PopulationResult", "replay", "train_population"]
