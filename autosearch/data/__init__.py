"""Datasets held in memory as uint8 image tensors, cleaned, with a stratified split.

Sources (``load_data(spec)``): ``"digits"`` (bundled), ``"mnist:PATH"``,
``"fashion-mnist[:PATH]"`` (IDX ``.gz`` files; the Debian package's folder by default),
``"cifar10:PATH"`` / ``"cifar100:PATH"`` (python batches), ``"folder:PATH"`` (one
sub-folder per class; or ``train/`` and ``test/`` folders of class sub-folders, the
second the test split), or ``(images, labels)`` arrays from Python. Decoded sources are
cached on disk by a hash of their files' contents.

An image folder whose decoded images would not fit in the memory budget (a quarter of
the machine's memory, or ``$AUTOSEARCH_DATA_MEMORY`` bytes) is *streamed*: it is
scanned once (every file decoded, checked and hashed for cleaning, then let go), and
its splits are :class:`FileSplit` s that trainers read through a ``DataLoader`` with
worker processes and a ``DistributedSampler``. Other sources are held in memory as
:class:`Split` s.

The test split is held out of every search decision: trials are ranked on the
validation split, and test accuracy only appears in reports. A dataset that ships a
test split keeps it; otherwise one is drawn, stratified, with the seed.
"""

from autosearch.data._augment import augment, cutout
from autosearch.data._clean import CleaningReport
from autosearch.data._stream import FileSplit, memory_budget
from autosearch.data.dataset import Dataset, Split
from autosearch.data.loading import dataset_names, load_data, spec_of

__all__ = [
    "CleaningReport",
    "Dataset",
    "FileSplit",
    "Split",
    "augment",
    "cutout",
    "dataset_names",
    "load_data",
    "memory_budget",
    "spec_of",
]
