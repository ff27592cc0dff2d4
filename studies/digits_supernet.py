"""digits-supernet: weight sharing on the bundled digits (`autosearch run
studies/digits_supernet.py`).

One supernet holds every ResNet of an elastic sub-space (stem width, and per stage
depth and width: 2 × 12³ = 3,456 subnets); it is trained once with the sandwich rule
and in-place distillation, then regularized evolution evaluates 200 subnets on it
(inherited weights, batch norm recalibrated), each in a fraction of a second. Subnets
on the accuracy-FLOPs front are also quantized to int8 from their inherited weights.
After the search, `autosearch run` trains the front's three most accurate subnets from
scratch (`confirm=3`, with the `train=` config), as trials of the study, and shows their
inherited against their confirmed accuracy; the best it reports and exports is then a
confirmed subnet (`autosearch confirm studies/digits_supernet.py -k 5` confirms more).
"""

from autosearch import Compression, StudySpec, SupernetConfig, TrainConfig
from controllers import RegularizedEvolution
from search_spaces import ResNetSpace

space = ResNetSpace(
    max_stages=3, depths=(1, 2, 3), widths=(8, 16, 24, 32), stem_widths=(8, 16)
).supernet(fixed={"stages": 3, "block": "basic", "shortcut": "pad"})

study = StudySpec(
    name="digits-supernet",
    controller=RegularizedEvolution(space, population=30, sample=8, seed=0),
    data="digits",
    objectives=("accuracy", "flops"),
    variants=("base", "int8"),
    compression=Compression(only_front=True),
    train=TrainConfig(epochs=10, batch_size=64, lr=0.05, crop_padding=1),
    supernet=SupernetConfig(
        train=TrainConfig(epochs=30, batch_size=64, lr=0.05, crop_padding=1),
        sandwich=2,
        latency=False,
    ),
    storage="sqlite:///runs/digits-supernet/study.db",
    n_trials=200,
    confirm=3,
)
