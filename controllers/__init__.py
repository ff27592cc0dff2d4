"""Controller plugins. Importing this package registers every controller in it."""

from controllers.random_search import RandomSearch

__all__ = ["RandomSearch"]
