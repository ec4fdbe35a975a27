"""Waiting for a condition, with a deadline and a message that says what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    predicate: Callable[[], object], timeout: float = 5.0, what: str = "condition", poll: float = 0.002
) -> None:
    """Return once ``predicate()`` is true; ``AssertionError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)
