"""digits-quick: the default study (`make run`).

Random search over small ResNets on scikit-learn's bundled digits (8×8 grayscale,
10 classes), 12 candidates trained for 10 epochs each. Each candidate on the
accuracy-FLOPs front so far is also pruned to half its channels (fine-tuned with
distillation from itself) and quantized to int8, and every variant is measured
(accuracy, MACs, latency, bytes). Results land in runs/digits-quick/.
"""

from autosearch import Compression, StudySpec, TrainConfig
from controllers import RandomSearch
from search_spaces import ResNetSpace

study = StudySpec(
    name="digits-quick",
    controller=RandomSearch(
        ResNetSpace(
            min_stages=2, max_stages=3, depths=(1, 2), widths=(8, 16, 32), stem_widths=(8, 16, 32)
        ),
        seed=0,
    ),
    data="digits",
    objectives=("accuracy", "flops"),
    variants=("base", "prune-channels@0.5", "int8"),
    compression=Compression(finetune_epochs=3, finetune_lr_scale=0.5, only_front=True),
    train=TrainConfig(epochs=10, batch_size=64, lr=0.05, crop_padding=1),
    storage="sqlite:///runs/digits-quick/study.db",
    n_trials=12,
)
