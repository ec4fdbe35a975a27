"""Kept while other branches still import it: the fuzz targets are :mod:`vlad.testing.fuzz`."""

import sys

from vlad.testing import fuzz

sys.modules[__name__] = fuzz
