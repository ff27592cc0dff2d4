"""
Search spaces and budgets
=========================

A search space describes networks by their *genes*; an architecture is one value per
gene. Spaces build for any input size, know the published networks they contain, and
keep every sample and mutation inside a budget of FLOPs and parameters, checked from
the genes before anything is built. Nothing is trained in this tutorial.
"""

# %%
# Genes, architectures, networks
# ------------------------------
import numpy as np
import plotly.graph_objects as go

import autosearch
from search_spaces import HyperparameterSpace, MobileNetSpace, NB201Space, ResNetSpace

space = ResNetSpace()
print("genes:", ", ".join(space.domains()))
print("published networks it holds:", space.references())
resnet20 = space.reference("resnet20")
print(space.describe(resnet20), space.cost(resnet20))

# %%
# The same architecture builds for any input: here 8×8 grey digits and 32×32 colour
# images (FLOPs are counted at the shape the budget names, so the cost differs).
small = space.build(resnet20, input_shape=(1, 8, 8), num_classes=10)
print(type(small).__name__, sum(p.numel() for p in small.parameters()), "parameters")

# %%
# A budget
# --------
# ``max_flops`` and ``max_params`` bound every sample, mutation and neighbour at the
# shape of ``budget_input``. Below: the FLOPs of 300 random architectures of a
# MobileNet space, without and with a budget of 20 MFLOPs on 28×28 images.
rng = np.random.default_rng(0)
free = MobileNetSpace(max_stages=4, budget_input=(1, 28, 28))
bounded = MobileNetSpace(max_stages=4, budget_input=(1, 28, 28), max_flops=20e6)
figure = go.Figure()
for label, s in (("no budget", free), ("max_flops=20e6", bounded)):
    flops = [s.cost(s.sample(rng)).flops / 1e6 for _ in range(300)]
    figure.add_histogram(x=flops, name=label, opacity=0.6, nbinsx=40)
    print(f"{label:15s} largest sampled: {max(flops):8.1f} MFLOPs")
figure.update_layout(barmode="overlay", xaxis_title="MFLOPs per image", yaxis_title="architectures")
figure

# %%
# A budget no architecture meets is refused in one line that says what to change.
try:
    ResNetSpace(max_flops=1e3, budget_input=(1, 8, 8)).sample(rng)
except autosearch.BudgetError as error:
    print("BudgetError:", error)

# %%
# Training hyperparameters, searched alongside
# --------------------------------------------
# :class:`search_spaces.HyperparameterSpace` adds learning rate, weight decay, batch
# size, optimizer and label smoothing genes to any space; the trainer applies them over
# the study's ``TrainConfig``.
with_hp = HyperparameterSpace(
    space=ResNetSpace(max_stages=2), lr=(0.03, 0.1), optimizer=("sgd", "adamw")
)
print(with_hp.describe(with_hp.sample(rng)))

# %%
# NAS-Bench-201 cells
# -------------------
# :class:`search_spaces.NB201Space` is the benchmark's cell: six edges, five operations
# each, 15,625 cells, written as the benchmark writes them.
nb201 = NB201Space()
cell = nb201.sample(rng)
print(nb201.describe(cell))
