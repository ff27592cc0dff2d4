"""
Compressed variants and the accuracy-per-FLOP score
===================================================

Users deploy a compressed model, so each candidate can be scored as a family: the
trained network and its variants (pruned, int8, distilled), each derived, evaluated and
measured on itself. A candidate's *reward*, what single-objective controllers see, is its
best variant's, by MnasNet's soft constraint ``accuracy × (FLOPs / target) ** -0.07``.
"""

# %%
# A study with variants
# ---------------------
import tempfile
from pathlib import Path

import autosearch
from controllers import RandomSearch
from search_spaces import ResNetSpace

folder = Path(tempfile.mkdtemp())
study = autosearch.create_study(
    "variants",
    controller=RandomSearch(
        ResNetSpace(min_stages=2, max_stages=2, depths=(1, 2), widths=(8, 16)), seed=1
    ),
    data="digits",
    variants=("base", "prune-channels@0.5", "int8"),
    compression=autosearch.Compression(finetune_epochs=1),
    reward="mnas",
    train=autosearch.TrainConfig(epochs=3, batch_size=64, lr=0.1),
    storage=f"sqlite:///{folder}/study.db",
)
records = study.optimize(2, show_progress_bar=False)

# %%
# One record per trial and variant
# --------------------------------
# ``prune-channels@0.5`` removes half of every layer's channels (torch-pruning follows
# the residual couplings) and fine-tunes with distillation from its parent: a really
# smaller network. ``int8`` is post-training static quantization (torchao PT2E); while
# searching its accuracy is estimated by fake quantization, and the points of the final
# front are lowered to real int8 kernels and measured when ``optimize`` ends.
print(f"{'trial':>5} {'variant':20} {'val acc':>8} {'MFLOPs':>7} {'kB':>7} {'reward':>7}")
for r in study.records():
    m = r.metrics
    print(
        f"{r.trial:>5} {r.variant:20} {m['accuracy']:8.3f} {m['flops'] / 1e6:7.3f} "
        f"{m['bytes'] / 1e3:7.1f} {m['reward']:7.3f}"
    )

# %%
# The front over every (architecture, variant) point; each variant is joined to its
# parent, and open markers are figures still estimated.
autosearch.report.plots.pareto(study)

# %%
# Rewards
# -------
# ``reward="mnas"`` (the default) targets the space's ``max_flops``, else the median
# FLOPs of 64 drawn architectures; ``"mnas@latency=2.5"``, ``"hard@macs=2e6"``
# (accuracy within the budget, 0 outside) and ``"accuracy"`` are the others. A plain
# ``"accuracy-per-gflop"`` exists but is a poor search signal: it grows without bound as
# networks shrink, so a network that guesses with a thousand FLOPs would beat every
# useful one.
best = max(study.records(), key=lambda r: r.metrics["reward"])
print("highest reward:", best.trial, best.variant, f"{best.metrics['reward']:.3f}")
