"""
Controllers (and ``walk=0``)
============================

A controller proposes the next architecture from the results so far. All of them take
the space first and a seed, may be asked several times before any result is told
(parallel workers), and resume exactly from a stored study. To compare them at no
training cost, this tutorial looks results up in a NAS-Bench-201-shaped table instead
of training: the synthetic table ``benchmarks/make_nb201_table.py`` writes (made up,
with the real table's structure, to develop against; pass your own real table the
same way).
"""

# %%
# A table instead of training
# ---------------------------
import subprocess
import sys
import tempfile
from pathlib import Path

import autosearch
from controllers import TPE, RandomSearch, RegularizedEvolution, Reinforce
from search_spaces import NB201Space

folder = Path(tempfile.mkdtemp())
repository = Path(autosearch.__file__).resolve().parents[1]
subprocess.run(
    [
        sys.executable,
        str(repository / "benchmarks" / "make_nb201_table.py"),
        str(folder / "nb201.csv"),
    ],
    check=True,
    capture_output=True,
)
table = autosearch.Table(path=str(folder / "nb201.csv"))

# %%
# Five searches of 60 evaluations
# -------------------------------
# Regularized evolution, REINFORCE and TPE take, most of the time once a few results
# are in, the unseen one-gene neighbour of the best result that a small predictor ranks
# highest (``walk``, the share of asks that do so). ``walk=0`` is the published
# algorithm alone.
space = NB201Space()
controllers = {
    "random": RandomSearch(space, seed=0),
    "evolution": RegularizedEvolution(space, seed=0),
    "evolution, walk=0": RegularizedEvolution(space, seed=0, walk=0),
    "tpe": TPE(space, seed=0),
    "reinforce": Reinforce(space, seed=0),
}
studies = []
for name, controller in controllers.items():
    study = autosearch.create_study(
        name,
        controller=controller,
        table=table,
        objectives=("accuracy",),
        storage=f"sqlite:///{folder}/controllers.db",
    )
    study.optimize(60, show_progress_bar=False)
    best = study.best()
    print(f"{name:18s} best {best.metrics['accuracy']:.2%} after 60: {best.description}")
    studies.append(study)

# %%
# The best result so far, evaluation by evaluation (one seed each: a comparison worth
# trusting needs many, as ``benchmarks/search_quality.py`` runs them).
autosearch.report.plots.compare(studies)
