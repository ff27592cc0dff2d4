"""An NNI model space searched by autosearch: the small CNN of
search_spaces/nni_examples.py (written with NNI's LayerChoice, nni.choice and Repeat) on
the bundled digits, with regularized evolution.

    pip install 'autosearch-nas[nni]'
    autosearch run studies/nni_small_cnn.py
"""

from autosearch import StudySpec, TrainConfig
from controllers import RegularizedEvolution
from search_spaces import from_nni

study = StudySpec(
    name="nni-small-cnn",
    controller=RegularizedEvolution(
        from_nni("search_spaces.nni_examples:SmallCNN", in_channels=1),
        seed=0,
        population=8,
        sample=3,
    ),
    data="digits",
    train=TrainConfig(epochs=5, batch_size=64, lr=0.05),
    n_trials=12,
)
