"""
Weight sharing: train once, search many, export, confirm
========================================================

Training every candidate is the whole cost of a search on real data. A supernet holds
every network of an elastic part of a space in one set of weights (Once-for-All,
BigNAS): it is trained once, and a candidate is then evaluated in a fraction of a second
by running only its part, with its batch-norm statistics recalibrated on a few hundred
training images. Any controller searches it unchanged.
"""

# %%
# An elastic sub-space and its study
# ----------------------------------
# ``.supernet(...)`` turns a space into the sub-space one supernet can share: here the
# stem width and each stage's depth and width vary, the rest is fixed.
import tempfile
from pathlib import Path

import autosearch
from autosearch import SupernetConfig, TrainConfig
from controllers import RegularizedEvolution
from search_spaces import ResNetSpace

folder = Path(tempfile.mkdtemp())
space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16, 24), stem_widths=(8, 16)).supernet(
    fixed={"stages": 2, "block": "basic", "shortcut": "pad"}
)
study = autosearch.create_study(
    "weight-sharing",
    controller=RegularizedEvolution(space, population=10, sample=4, seed=0),
    data="digits",
    train=TrainConfig(epochs=2, batch_size=64, lr=0.1),  # how a confirmation trains
    supernet=SupernetConfig(train=TrainConfig(epochs=3, batch_size=64, lr=0.1), latency=False),
    storage=f"sqlite:///{folder}/study.db",
)

# %%
# Train once
# ----------
# The sandwich rule: each step trains the largest subnet on the labels, and the
# smallest and two random ones on its predictions. The weights are stored with the
# study (with a content hash every trial records).
supernet = study.supernet.train()
print(
    "supernet:",
    supernet["status"],
    "after",
    supernet.get("epochs"),
    "epochs; weights",
    supernet["digest"],
)

# %%
# Search many
# -----------
# Each trial is now a subnet evaluated on the supernet, an ordinary trial otherwise.
records = study.optimize(40, show_progress_bar=False)
print(len(records), "subnets evaluated")
autosearch.report.plots.pareto(study)

# %%
# Confirm by training
# -------------------
# A supernet's ranking is approximate (the measured results say how approximate), so
# before trusting its favourite, train the front's most accurate subnets from scratch,
# as ordinary trials of the study. ``best()`` then prefers confirmed results.
confirmed = study.supernet.confirm(2)
for c in study.supernet.confirmations():
    print(
        f"trial {c.trial}: {c.description:30s} "
        f"inherited {c.inherited:.3f}, trained {c.confirmed:.3f}"
    )

# %%
# Export
# ------
# The chosen subnet is an ordinary network of the wrapped space, exported with the
# weights its confirmation trained.
best = study.best()
print("best:", best.trial, best.description, "confirms trial", best.confirms)
out = study.export(best, folder / "best")
print(sorted(p.name for p in (folder / "best").iterdir()))
