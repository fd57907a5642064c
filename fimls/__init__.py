"""fimls: local fill-in-the-middle code completion served over the Language Server Protocol."""

__version__ = "0.1.0"
