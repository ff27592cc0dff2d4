"""
The first study and its Pareto front
====================================

A study searches a space of networks with a controller, trains every candidate it
proposes on your data, and keeps each result in an Optuna storage. Here: random search
over small ResNets on scikit-learn's bundled 8×8 digits, four candidates of two
epochs each (a real study trains longer; see :doc:`/get-started`).
"""

# %%
# A space, a controller, a study
# -------------------------------
# :class:`search_spaces.ResNetSpace` describes residual networks by their genes (stem
# width, block type, stages, each stage's depth, width and stride); this one is small
# enough for 8×8 images. :class:`controllers.RandomSearch` proposes architectures from
# it, never the same one twice. :func:`autosearch.create_study` ties them to the data,
# the objectives and a storage (SQLite here, in a fresh folder).
import tempfile
from pathlib import Path

import autosearch
from controllers import RandomSearch
from search_spaces import ResNetSpace

folder = Path(tempfile.mkdtemp())
space = ResNetSpace(min_stages=2, max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8,))
study = autosearch.create_study(
    "first",
    controller=RandomSearch(space, seed=0),
    data="digits",
    objectives=("accuracy", "flops"),
    train=autosearch.TrainConfig(epochs=2, batch_size=64, lr=0.1),
    storage=f"sqlite:///{folder}/study.db",
)
records = study.optimize(n_trials=4, show_progress_bar=False)

# %%
# Every trial is a record
# -----------------------
# Each record holds the architecture and what was measured of it: validation accuracy
# (the split every search decision uses), test accuracy (held out, only reported),
# FLOPs, parameters, bytes and latency.
for record in study.records():
    m = record.metrics
    print(
        f"trial {record.trial}: {record.description:34s} "
        f"val {m['accuracy']:.3f}  {m['flops'] / 1e6:5.2f} MFLOPs  "
        f"{m['params'] / 1e3:5.1f} k params"
    )

# %%
# The Pareto front
# ----------------
# :meth:`autosearch.Study.pareto` returns the records no other record beats on every
# objective at once: here, the most accurate network for each FLOPs budget.
for record in study.pareto():
    print(record.trial, record.description, f"{record.metrics['accuracy']:.3f}")

# %%
# :func:`autosearch.report.plots.pareto` draws it (hover a point for its architecture; the
# line joins the front).
autosearch.report.plots.pareto(study)

# %%
# Choose and export
# -----------------
# :meth:`autosearch.Study.best` picks the most accurate record within a budget, and
# :meth:`autosearch.Study.export` writes it as a folder that needs only torch (the
# tutorial :doc:`plot_09_exported_model` loads one).
best = study.best(max_flops=2e6)
print("best under 2 MFLOPs:", best.trial, best.description, f"{best.metrics['accuracy']:.3f}")
out = study.export(best, folder / "best")
print(sorted(p.name for p in (folder / "best").iterdir()))
