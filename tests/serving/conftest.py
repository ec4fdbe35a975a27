"""Fixtures for the in-process serving tests (the rig itself is in tests/serving/rig.py)."""

from __future__ import annotations

import pytest

from tests.serving.rig import Rig


@pytest.fixture()
def rig(contract, tokenizer):
    r = Rig(contract, tokenizer)
    yield r
    r.close()
