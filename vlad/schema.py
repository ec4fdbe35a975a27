"""The one schema parser: TOML-shaped data -> frozen typed dataclasses, every problem at once.

Config, contract and manifest are all parsed here, driven by their dataclasses' type
hints, so a value of the wrong type is one clear line (``serve.warmup: expected an
integer, got a float``) wherever it appears, and nothing downstream re-checks types.

Supported field types: ``str`` (non-empty unless ``metadata={"allow_empty": True}``),
``int`` (a TOML integer, never a boolean or float), ``float`` (finite; integers accepted),
``bool``, ``Literal[...]`` of strings, ``X | None`` (absent, or null in JSON), ``tuple[X, ...]`` (from an array),
nested dataclasses (from a table), ``datetime`` (TOML datetime or RFC 3339 string, with a
UTC offset), ``Mapping[str, Any]`` / ``dict[str, Any]`` (a free-form table, e.g. backend
options, whose values the owner checks) and ``Mapping[str, X]`` / ``dict[str, X]`` (a table
whose every value is an ``X``, e.g. the status's counters by reason). Unknown keys are problems with a "did you mean"
hint; a dataclass may name keys it refuses with a reason in a ``REFUSED_KEYS`` class
variable (``{"signature": "signatures are detached ..."}``). Field metadata: ``internal``
(not read from data), ``allow_empty``, ``max_len``, ``min`` / ``max`` bounds for numbers
(:func:`bounded`, inclusive), ``positive`` (a number > 0), and for strings :func:`sha256` (64 lowercase hex digits) and
:func:`relpath` (a plain relative path inside a folder, not naming its reserved files).

After a dataclass parsed, an optional check ``checks[cls](obj, path, problems)`` runs its
cross-field rules. A check marked with :func:`on_partial` also runs when part of the
dataclass did not parse: it then receives a partial object whose broken or missing fields
are None (a partial array holds None for its broken items), so a rule between sections
still reports what it can see and every problem is listed at once. A partial object never
leaves the parser. :func:`parse` raises ``error(source, problems)``.
"""

from __future__ import annotations

import collections.abc
import datetime as dt
import difflib
import math
import re
import typing
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Literal, TypeVar

from vlad.errors import ProblemsError
from vlad.files import FileRefused, relative_parts

T = TypeVar("T")
Check = Callable[[Any, str, list[str]], None]


class Broken:
    """A value that failed to parse; its problems are already recorded.

    ``partial`` keeps what did parse (see the module docstring), None when nothing did.
    """

    __slots__ = ("partial",)

    def __init__(self, partial: Any = None) -> None:
        self.partial = partial


# The plain failed value: nothing of it can be salvaged.
BROKEN: Any = Broken()
_HINTS: dict[type, dict[str, Any]] = {}
_ON_PARTIAL: set[Check] = set()  # checks marked with on_partial()
_UnionType = type(int | None)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# TOML nests at most this deep in any of our files; deeper is hostile input.
MAX_DEPTH = 32


def parse(
    cls: type[T], data: Any, source: str, error: type[ProblemsError], checks: Mapping[type, Check] | None = None
) -> T:
    """Validate ``data`` into ``cls`` or raise ``error(source, problems)`` listing every problem."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise error(source, [f"expected a table at top level, got {kind(data)}"])
    value = convert(cls, data, "", problems, checks=checks or {})
    if problems or isinstance(value, Broken):
        raise error(source, problems or ["invalid"])
    return typing.cast(T, value)


def hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# bool before int: a bool is an int to isinstance.
_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a float"),
    (str, "a string"),
    (list, "an array"),
    (dict, "a table"),
    (dt.datetime, "a datetime"),
)


def kind(value: Any) -> str:
    """A TOML-ish name for the type of ``value`` (for messages)."""
    for cls, name in _KINDS:
        if isinstance(value, cls):
            return name
    return f"a {type(value).__name__}"


def parse_fields(
    cls: type, raw: Mapping[str, Any], path: str, problems: list[str], checks: Mapping[type, Check], depth: int = 0
) -> tuple[dict[str, Any], bool]:
    """Convert the keys of ``raw`` to ``cls``'s fields; returns (good values, all good)."""
    values, _, complete = _parse_fields(cls, raw, path, problems, checks, depth)
    return values, complete


def _parse_fields(
    cls: type, raw: Mapping[str, Any], path: str, problems: list[str], checks: Mapping[type, Check], depth: int
) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(good values, partial values of the broken fields, all good)."""
    types = hints(cls)
    values: dict[str, Any] = {}
    salvaged: dict[str, Any] = {}
    complete = True
    known = [f.name for f in fields(cls) if not f.metadata.get("internal") and f.init]
    for f in fields(cls):
        if f.metadata.get("internal") or not f.init:
            continue
        fpath = join(path, f.name)
        tp = types[f.name]
        if f.name not in raw:
            if f.default is not MISSING:
                values[f.name] = f.default
            elif f.default_factory is not MISSING:
                values[f.name] = f.default_factory()
            elif optional_arg(tp) is not None:
                values[f.name] = None
            else:
                problems.append(f"{fpath}: missing")
                complete = False
            continue
        value = convert(tp, raw[f.name], fpath, problems, f.metadata, checks, depth + 1)
        if isinstance(value, Broken):
            complete = False
            salvaged[f.name] = value.partial
        else:
            values[f.name] = value
    refused: Mapping[str, str] = getattr(cls, "REFUSED_KEYS", {})
    for key in raw:
        if key in refused:
            problems.append(f"{join(path, str(key))}: {refused[key]}")
            complete = False
        elif key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
            problems.append(f"{join(path, shown(key)[1:-1])}: unknown key ({hint})")
            complete = False
    return values, salvaged, complete


def optional_arg(tp: Any) -> Any:
    """``X`` for ``X | None``, else None."""
    if typing.get_origin(tp) in (typing.Union, _UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def convert(
    tp: Any,
    value: Any,
    path: str,
    problems: list[str],
    meta: Any = None,
    checks: Mapping[type, Check] | None = None,
    depth: int = 0,
) -> Any:
    """Check ``value`` against type ``tp``; returns the converted value or :data:`BROKEN`."""
    checks = checks or {}
    if depth > MAX_DEPTH:
        problems.append(f"{path}: nested deeper than {MAX_DEPTH} levels")
        return BROKEN
    inner = optional_arg(tp)
    if inner is not None:
        if value is None:  # JSON's and msgpack's null (TOML has none: there the key is absent)
            return None
        tp = inner
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string, got {kind(value)}")
            return BROKEN
        if value not in allowed:
            problems.append(f"{path}: unknown value {shown(value)} (known: {', '.join(allowed)})")
            return BROKEN
        return value
    if origin is tuple:
        item_tp = typing.get_args(tp)[0]
        if not isinstance(value, list):
            problems.append(f"{path}: expected an array, got {kind(value)}")
            return BROKEN
        items = [convert(item_tp, v, f"{path}[{i}]", problems, None, checks, depth + 1) for i, v in enumerate(value)]
        if any(isinstance(i, Broken) for i in items):
            return Broken(tuple(i.partial if isinstance(i, Broken) else i for i in items))
        return tuple(items)
    if origin in (dict, collections.abc.Mapping) or tp in (dict, Mapping):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a table, got {kind(value)}")
            return BROKEN
        if _depth(value) + depth > MAX_DEPTH:
            problems.append(f"{path}: nested deeper than {MAX_DEPTH} levels")
            return BROKEN
        if not _string_keys(value):  # msgpack maps may have other keys; JSON and TOML cannot
            problems.append(f"{path}: expected string keys in every table")
            return BROKEN
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is Any:
            return dict(value)  # free-form: the owner checks the values
        # Typed values (``Mapping[str, int]``, ``dict[str, Percentiles]``): each one converted.
        out: dict[str, Any] = {}
        broken = False
        for key, item in value.items():
            out[key] = convert(args[1], item, join(path, key), problems, None, checks, depth + 1)
            broken = broken or isinstance(out[key], Broken)
        if broken:
            return Broken({k: v.partial if isinstance(v, Broken) else v for k, v in out.items()})
        return out
    if is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a table, got {kind(value)}")
            return BROKEN
        values, salvaged, complete = _parse_fields(typing.cast(type, tp), value, path, problems, checks, depth)
        check = checks.get(typing.cast(type, tp))
        if not complete:
            partial = _partial(typing.cast(type, tp), {**values, **salvaged})
            if partial is not None and check is not None and check in _ON_PARTIAL:
                check(partial, path, problems)
            return Broken(partial)
        obj = typing.cast(Callable[..., Any], tp)(**values)
        if check is not None:
            check(obj, path, problems)
        return obj
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string, got {kind(value)}")
            return BROKEN
        if not value.strip() and not (meta and meta.get("allow_empty")):
            problems.append(f"{path}: must not be empty")
            return BROKEN
        if "\x00" in value:
            problems.append(f"{path}: must not contain NUL characters")
            return BROKEN
        if meta and meta.get("max_len") is not None and len(value) > meta["max_len"]:
            problems.append(f"{path}: longer than {meta['max_len']} characters")
            return BROKEN
        if meta and meta.get("sha256") and not _SHA256_RE.fullmatch(value):
            problems.append(f"{path}: expected 64 lowercase hex digits, got {shown(value)}")
            return BROKEN
        if meta and meta.get("relpath") is not None:
            problem = relpath_problem(value, meta["relpath"], meta.get("reserved", ()))
            if problem:
                problems.append(f"{path}: {problem}")
                return BROKEN
        return value
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"{path}: expected true or false, got {kind(value)}")
            return BROKEN
        return value
    if tp is int:
        # bool is an int in Python but `true` is never a meaningful size in TOML.
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{path}: expected an integer, got {kind(value)}")
            return BROKEN
        return _bounded(value, path, problems, meta)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{path}: expected a number, got {kind(value)}")
            return BROKEN
        if not math.isfinite(value):
            problems.append(f"{path}: must be finite, got {value}")
            return BROKEN
        return _bounded(float(value), path, problems, meta)
    if tp is dt.datetime:
        if isinstance(value, str):
            try:
                value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                problems.append(f"{path}: not an RFC 3339 timestamp: {shown(value)}")
                return BROKEN
        if not isinstance(value, dt.datetime):
            problems.append(f"{path}: expected a datetime, got {kind(value)}")
            return BROKEN
        if value.tzinfo is None:
            problems.append(f"{path}: needs a UTC offset (e.g. 2025-01-01T00:00:00Z)")
            return BROKEN
        return value.astimezone(dt.UTC)
    if tp is Any:
        return value
    raise TypeError(f"schema uses an unsupported type {tp!r} at {path}")


def _partial(cls: type, values: Mapping[str, Any]) -> Any:
    """``cls`` built from what parsed, None for every other field (None if it cannot be built)."""
    kwargs = {f.name: values.get(f.name) for f in fields(cls) if f.init and not f.metadata.get("internal")}
    try:
        return typing.cast(Callable[..., Any], cls)(**kwargs)
    except Exception:  # a __post_init__ refusing None: nothing to salvage, the problems stand
        return None


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: a problem names hostile input, it does not
    echo all of it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-1]}"


# ---- one line of text a human reads (who, why) ------------------------------------------

LINE_MAX_LEN = 1024  # characters of one line of operator text (a reason, a name)
# Characters one line of text may not hold: they break the one-line logs, events and
# listings it ends up in (newline, escape, DEL and the other controls), or make a line read
# other than it is (bidi overrides and other format characters; line and paragraph
# separators; surrogates, private-use and unassigned code points).
NOT_IN_A_LINE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def line_problem(value: str, max_len: int = LINE_MAX_LEN) -> str | None:
    """Why ``value`` is not one line of text of at most ``max_len`` characters (empty, too
    long, or holding a character of :data:`NOT_IN_A_LINE`); None when it is. The one rule
    for the operator's text on every way it is recorded: the daemon's control arguments and
    the release store's ``who``/``why``."""
    if not value.strip():
        return "must not be empty"
    if len(value) > max_len:
        return f"longer than {max_len} characters"
    bad = next((c for c in value if unicodedata.category(c) in NOT_IN_A_LINE), None)
    if bad is not None:
        return f"control or format character U+{ord(bad):04X} refused (one line of text only)"
    return None


def one_line(value: str, max_len: int | None = LINE_MAX_LEN) -> str:
    """``value`` safe to print as one line: each character :func:`line_problem` refuses is
    written as its escape (``\\x1b``, ``\\u202e``), and text longer than ``max_len``
    characters (None: any length) is cut, saying how much was left out. Text that passes
    :func:`line_problem` comes back unchanged, and so does what this returned."""
    out = "".join(_escape(c) if unicodedata.category(c) in NOT_IN_A_LINE else c for c in value)
    if max_len is None or len(out) <= max_len:
        return out
    marker = ""
    while True:  # the marker's length depends on the count it states: two rounds at most
        keep = max(0, max_len - len(marker))
        again = f" [... {len(out) - keep} more characters]"
        if again == marker:
            return out[:keep] + marker
        marker = again


def _escape(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def relpath_problem(value: str, folder: str, reserved: tuple[str, ...] = ()) -> str | None:
    """Why ``value`` is not a plain relative path inside ``folder`` naming none of ``reserved``."""
    try:
        relative_parts(value)
    except FileRefused:
        return f"must be a plain relative path inside {folder}, got {shown(value)}"
    if value in reserved:
        return f"{shown(value)} is one of the reserved files of {folder} ({', '.join(reserved)})"
    return None


def _bounded(value: Any, path: str, problems: list[str], meta: Any) -> Any:
    if meta and meta.get("positive") and value <= 0:
        problems.append(f"{path}: must be > 0, got {value}")
        return BROKEN
    if meta:
        lo, hi = meta.get("min"), meta.get("max")
        if lo is not None and value < lo:
            problems.append(f"{path}: must be >= {lo}, got {value}")
            return BROKEN
        if hi is not None and value > hi:
            problems.append(f"{path}: must be <= {hi}, got {value}")
            return BROKEN
    return value


def _string_keys(value: Any) -> bool:
    """Whether every table in ``value`` (nested ones too) has only string keys (iterative;
    called after the depth check)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                return False
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _depth(value: Any, limit: int = MAX_DEPTH + 1) -> int:
    """Nesting depth of tables and arrays (iterative: hostile input must not recurse)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if d > limit:
            return d
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def bounded(lo: float | None = None, hi: float | None = None, **extra: Any) -> dict[str, Any]:
    """Field metadata for a number range: ``field(default=5, metadata=bounded(1))``."""
    return {"min": lo, "max": hi, **extra}


def sha256(**extra: Any) -> dict[str, Any]:
    """Field metadata for a hex sha256 digest: ``field(metadata=sha256())``."""
    return {"sha256": True, **extra}


def relpath(folder: str, reserved: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """Field metadata for a file named by a plain relative path inside ``folder`` (no ``..``,
    ``.``, empty component, leading ``/`` or backslash), none of the ``reserved`` names."""
    return {"relpath": folder, "reserved": reserved, **extra}


def on_partial(check: Check) -> Check:
    """Mark ``check`` to run also on a partial object (see the module docstring): its rules
    must read every field as possibly None."""
    _ON_PARTIAL.add(check)
    return check
