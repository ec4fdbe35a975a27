"""vlad.schema's field kinds and checks, on small dataclasses of their own (config, contract
and manifest exercise the rest through their loaders)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pytest

from vlad import schema
from vlad.errors import ProblemsError


class Bad(ProblemsError):
    pass


@dataclass(frozen=True)
class Item:
    name: str
    kind: Literal["a", "b"]


@dataclass(frozen=True, kw_only=True)
class Doc:
    REFUSED_KEYS: ClassVar[dict[str, str]] = {"sig": "signatures live next to the file"}

    digest: str = field(metadata=schema.sha256())
    file: str = field(metadata=schema.relpath("the folder", reserved=("index.toml",)))
    items: tuple[Item, ...] = ()
    ref: str | None = None


def _problems(data, checks=None) -> list[str]:
    with pytest.raises(Bad) as info:
        schema.parse(Doc, data, "d", Bad, checks)
    return list(info.value.problems)


GOOD = {"digest": "ab" * 32, "file": "sub/w.bin", "items": [{"name": "x", "kind": "a"}]}


def test_a_good_document_parses():
    doc = schema.parse(Doc, GOOD, "d", Bad)
    assert doc.items == (Item("x", "a"),) and doc.file == "sub/w.bin"


@pytest.mark.parametrize("digest", ["AB" * 32, "ab" * 31, "ab" * 32 + "0", "zz" * 32, " " + "ab" * 32])
def test_sha256_is_64_lowercase_hex_digits(digest):
    assert _problems({**GOOD, "digest": digest}) == [f"digest: expected 64 lowercase hex digits, got {digest!r}"]


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../b", "./a", "a//b", "a/", "a\\b", "."])
def test_relpath_stays_plainly_inside_its_folder(path):
    assert _problems({**GOOD, "file": path}) == [f"file: must be a plain relative path inside the folder, got {path!r}"]


def test_relpath_refuses_a_reserved_name():
    assert _problems({**GOOD, "file": "index.toml"}) == [
        "file: 'index.toml' is one of the reserved files of the folder (index.toml)"
    ]


def test_a_refused_key_says_why():
    assert _problems({**GOOD, "sig": "x"}) == ["sig: signatures live next to the file"]


def _refs_listed(doc: Doc, path: str, problems: list[str]) -> None:
    names = [i.name for i in doc.items or () if i is not None]
    if doc.ref is not None and doc.items is not None and doc.ref not in names:
        problems.append(f"ref: {doc.ref!r} is not an item")


def test_a_partial_check_sees_past_a_broken_item_and_a_plain_check_does_not():
    """One broken item: the partial check still finds the unknown reference (and sees the
    broken item's good name, so it does not call 'y' unknown); a plain check never runs on
    a partial object."""
    data = {**GOOD, "items": [{"name": "y", "kind": "c"}, 5], "ref": "z"}
    problems = _problems(data, {Doc: schema.on_partial(_refs_listed)})
    assert problems == [
        "items[0].kind: unknown value 'c' (known: a, b)",
        "items[1]: expected a table, got an integer",
        "ref: 'z' is not an item",
    ]
    plain = _problems(data, {Doc: lambda doc, path, problems: problems.append("ran")})
    assert "ran" not in plain and len(plain) == 2
    assert "ref: 'y' is not an item" not in _problems({**data, "ref": "y"}, {Doc: schema.on_partial(_refs_listed)})


@dataclass(frozen=True)
class Rate:
    hz: float = field(metadata={"positive": True})
    count: int = field(default=1, metadata={"positive": True})


@pytest.mark.parametrize(
    ("data", "problem"),
    [({"hz": 0}, "hz: must be > 0, got 0.0"), ({"hz": 1, "count": -2}, "count: must be > 0, got -2")],
)
def test_positive_is_strictly_above_zero(data, problem):
    with pytest.raises(Bad) as info:
        schema.parse(Rate, data, "r", Bad)
    assert info.value.problems == [problem]
    assert schema.parse(Rate, {"hz": 1e-9}, "r", Bad).hz == 1e-9
