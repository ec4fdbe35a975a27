"""vlad: an on-robot supervisor daemon that serves Vision-Language-Action policies."""

__version__ = "0.1.0"
