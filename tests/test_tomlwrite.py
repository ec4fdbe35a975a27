"""The one TOML writer: whatever it writes, tomllib reads back to the same mapping."""

from __future__ import annotations

import datetime as dt
import math
import tomllib

import pytest

from vlad.tomlwrite import dumps

AWKWARD = [
    'say "hi"',
    "back\\slash",
    "two\nlines\ttab",
    "ünïcødé ✓ 机器人",
    "",
    "'single'",
    "\x01ctl",
    "#not a comment",
]


@pytest.mark.parametrize("s", AWKWARD)
def test_awkward_strings_and_keys_round_trip(s: str) -> None:
    data = {"v": s, "t": {s or "empty": s, "a b.c": [s, s]}, "rows": [{"k": s}, {"k": s, "n": 1}]}
    if not s:
        data["t"][""] = "empty key"
    assert tomllib.loads(dumps(data)) == data


def test_scalars_nested_tables_and_arrays_round_trip() -> None:
    data = {
        "format": 1,
        "flag": False,
        "x": -0.125,
        "big": 2**62,
        "when": dt.datetime(2026, 12, 4, 13, 0, tzinfo=dt.UTC),
        "list": [1, 2, 3],
        "inline": [{"a": 1}, {"a": 2}],
        "serve": {"port": 5555, "deep": {"deeper": {"name": "x"}}, "chain": [{"b": "onnx"}, {"b": "torch"}]},
        "empty": {},
        "none": [],
    }
    back = tomllib.loads(dumps(data, header="a header\n\nsecond line", inline=("inline",)))
    assert back == data
    assert dumps(data, inline=("inline",)).count("[[") == 2  # serve.chain as sections, inline stays inline


def test_non_finite_floats_round_trip() -> None:
    back = tomllib.loads(dumps({"a": math.inf, "b": -math.inf, "c": math.nan}))
    assert back["a"] == math.inf and back["b"] == -math.inf and math.isnan(back["c"])


def test_header_is_comments() -> None:
    text = dumps({"a": 1}, header="first\n\nthird")
    assert text.splitlines()[:3] == ["# first", "#", "# third"]


def test_unwritable_value_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot write object"):
        dumps({"a": object()})
