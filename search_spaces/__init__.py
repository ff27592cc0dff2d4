"""Search-space plugins. Importing this package registers every space in it."""

from search_spaces.resnet import ResNetSpace

__all__ = ["ResNetSpace"]
