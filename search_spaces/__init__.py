"""Search-space plugins. Importing this package registers every space in it."""

from search_spaces.densenet import DenseNetSpace
from search_spaces.elastic import ElasticSpace
from search_spaces.hyper import HyperparameterSpace
from search_spaces.mobilenet import MobileNetSpace
from search_spaces.nb201 import NB201Space
from search_spaces.nni_space import NNISpace, from_nni, register_nni_space
from search_spaces.resnet import ResNetSpace
from search_spaces.small_cnn import SmallCNNSpace

__all__ = [
    "DenseNetSpace",
    "ElasticSpace",
    "HyperparameterSpace",
    "MobileNetSpace",
    "NB201Space",
    "NNISpace",
    "ResNetSpace",
    "SmallCNNSpace",
    "from_nni",
    "register_nni_space",
]
