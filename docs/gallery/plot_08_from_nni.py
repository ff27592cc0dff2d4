"""
Coming from NNI
===============

NNI 3 model spaces (``ModelSpace`` with ``LayerChoice``, ``nni.choice``, ``Repeat``)
run in autosearch unchanged: :func:`search_spaces.from_nni` turns one into a search
space whose genes are the space's mutables, and every controller searches it. Here the
small CNN of ``search_spaces/nni_examples.py``, written with NNI, on the digits.
"""

# %%
# An NNI model space as a search space
# ------------------------------------
# NNI 3 warns, when imported, that it does not know some classes of the current
# PyTorch; the warnings are harmless and filtered here.
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"nni\.")

import autosearch
from controllers import RegularizedEvolution
from search_spaces import from_nni

space = from_nni("search_spaces.nni_examples:SmallCNN", in_channels=1)
print("genes (NNI's mutables):", list(space.domains()))

# %%
# Searched like any space
# -----------------------
# Each trial trains ``model_space.freeze(sample)`` with the shared trainer.
folder = Path(tempfile.mkdtemp())
study = autosearch.create_study(
    "nni",
    controller=RegularizedEvolution(space, population=4, sample=2, seed=0),
    data="digits",
    train=autosearch.TrainConfig(epochs=2, batch_size=64, lr=0.05),
    storage=f"sqlite:///{folder}/study.db",
)
records = study.optimize(3, show_progress_bar=False)
for r in study.records():
    print(
        r.trial,
        r.description,
        f"{r.metrics['accuracy']:.3f}",
        f"{r.metrics['flops'] / 1e6:.2f} MFLOPs",
    )

# %%
# The mapping, for those who know NNI: ``nni.nas.strategy.RegularizedEvolution`` →
# :class:`controllers.RegularizedEvolution`, ``PolicyBasedRL`` →
# :class:`controllers.Reinforce`, TPE → :class:`controllers.TPE`;
# ``NasExperiment(...).run()`` → :meth:`autosearch.Study.optimize`;
# ``exp.export_top_models()`` → :meth:`autosearch.Study.best` and
# :meth:`autosearch.Study.export`. The guide page :doc:`/guide/nni` has the whole table.
autosearch.report.plots.pareto(study)
