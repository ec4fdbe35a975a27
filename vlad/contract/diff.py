"""Field-by-field comparison of two contracts, with which differences break compatibility."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from vlad.contract.model import Contract, _plain
from vlad.schema import join as _join

# Why each category matters. Breaking = the same weights would be fed or read
# differently, so the release must not pass the contract gate against the other one.
CATEGORY_REASONS: dict[str, tuple[bool, str]] = {
    "format": (True, "contract format version"),
    "structure": (True, "a section, camera, joint or tensor was added or removed"),
    "wiring": (True, "a section now feeds / reads a different model tensor"),
    "dtype": (True, "tensor or image dtype"),
    "shape": (True, "shape, resolution, dynamic range, chunk length, dim or max tokens"),
    "normalization": (True, "mean/std/scale, tokenizer file or padding: values change meaning"),
    "tokenizer": (True, "tokenizer identity or library version"),
    "preprocessing": (True, "image resize or crop method"),
    "unit": (True, "physical unit"),
    "order": (True, "order of cameras, joints or proprio entries"),
    "frame": (True, "reference frame"),
    "color_order": (True, "image color order"),
    "layout": (True, "image or tensor layout"),
    "semantics": (True, "action semantics (position/velocity/delta/torque)"),
    "noise": (True, "noise seeding rule"),
    "safety": (False, "guard setting (bounds, rate limit, fallback behaviour): review"),
    "timing": (False, "control cadence or freshness limit"),
    "info": (False, "informational"),
}


def _leaves(category: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, category)


# Category of a changed field by its key; anything not listed is "structure" (breaking).
_LEAF_CATEGORY = {
    **_leaves("format", "format"),
    **_leaves("wiring", "input", "output"),
    **_leaves("dtype", "dtype"),
    **_leaves(
        "shape", "shape", "height", "width", "chunk_length", "dim", "max_tokens", "frames", "axis", "min", "opt", "max"
    ),
    **_leaves("normalization", "mean", "std", "scale", "sha256", "pad_id", "padding_side", "truncation"),
    **_leaves("tokenizer", "tokenizer", "library", "library_version"),
    **_leaves("preprocessing", "resize", "crop"),
    **_leaves("unit", "unit", "units"),
    **_leaves("order", "names"),
    **_leaves("frame", "frame"),
    **_leaves("color_order", "color_order"),
    **_leaves("layout", "layout"),
    **_leaves("semantics", "semantics"),
    **_leaves("noise", "seeding"),
    **_leaves("safety", "lower", "upper", "rate_limit", "on_nonfinite", "on_bound_violation", "hold_posture"),
}


@dataclass(frozen=True, slots=True)
class FieldDiff:
    """One differing field between two contracts.

    ``path`` is dotted, with table-array entries keyed by name (``cameras[overhead]``)
    or, for dynamic axes, by axis number (``inputs[tokens].dynamic[0]``). ``old`` /
    ``new`` are plain values (None where absent).
    """

    path: str
    old: Any
    new: Any
    category: str
    breaking: bool

    @property
    def reason(self) -> str:
        """A short human explanation of the category."""
        return CATEGORY_REASONS[self.category][1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "path": self.path,
            "old": self.old,
            "new": self.new,
            "category": self.category,
            "breaking": self.breaking,
            "reason": self.reason,
        }


def diff_contracts(a: Contract, b: Contract) -> list[FieldDiff]:
    """Every field that differs from ``a`` (old) to ``b`` (new), in contract order.

    Identical contracts give an empty list. Each difference carries a category and
    whether it is breaking (see ``CATEGORY_REASONS`` and docs/contract.md).
    """
    out: list[FieldDiff] = []
    _walk(a, b, "", (), out)
    return out


def _category(parts: tuple[str, ...]) -> str:
    head, leaf = parts[0], parts[-1]
    if head == "model":
        return "info"  # id, version, family, description: identity, not I/O
    if head == "timing":
        return "timing"
    if head == "language" and leaf == "file":
        return "info"  # the content is pinned by language.sha256
    if head == "noise" and leaf in ("seed", "denoising_steps"):
        # The seed changes the sample, not the distribution; denoising steps are baked
        # into the exported graph and compared by the equivalence gate.
        return "info"
    if leaf == "name":
        return "info"  # only dynamic-axis labels reach here; tables are keyed by name
    return _LEAF_CATEGORY.get(leaf, "structure")


def _diff(path: str, parts: tuple[str, ...], old: Any, new: Any, category: str | None = None) -> FieldDiff:
    category = category or _category(parts)
    return FieldDiff(path, _plain(old), _plain(new), category, CATEGORY_REASONS[category][0])


def _walk(a: Any, b: Any, path: str, parts: tuple[str, ...], out: list[FieldDiff]) -> None:
    if a == b:
        return
    if is_dataclass(a) and type(a) is type(b):
        for f in fields(a):
            if f.compare:
                _walk(getattr(a, f.name), getattr(b, f.name), _join(path, f.name), parts + (f.name,), out)
        return
    if isinstance(a, tuple) and isinstance(b, tuple) and any(is_dataclass(x) for x in a + b):
        _walk_tables(a, b, path, parts, out)
        return
    if (a is None) != (b is None):
        out.append(_diff(path, parts, a, b, "structure"))  # optional section added/removed
        return
    out.append(_diff(path, parts, a, b))


def _walk_tables(
    a: tuple[Any, ...], b: tuple[Any, ...], path: str, parts: tuple[str, ...], out: list[FieldDiff]
) -> None:
    """Match table-array entries by key so that a reorder is not read as N changes."""
    dynamic = parts[-1] == "dynamic"

    def key(x: Any) -> str:
        return str(x.axis) if dynamic else x.name

    ka, kb = [key(x) for x in a], [key(x) for x in b]
    if len(set(ka)) != len(ka) or len(set(kb)) != len(kb):
        # Duplicate keys (only in unvalidated data): fall back to comparing by index.
        ka, kb = [str(i) for i in range(len(a))], [str(i) for i in range(len(b))]
    ma, mb = dict(zip(ka, a, strict=True)), dict(zip(kb, b, strict=True))
    removed_or_added = "shape" if dynamic else "structure"
    for k in ka:
        if k not in mb:
            out.append(_diff(f"{path}[{k}]", parts, ma[k], None, removed_or_added))
    for k in kb:
        if k not in ma:
            out.append(_diff(f"{path}[{k}]", parts, None, mb[k], removed_or_added))
    common_a = [k for k in ka if k in mb]
    common_b = [k for k in kb if k in ma]
    if common_a != common_b and not dynamic:
        # Camera and joint order is the order of model inputs and action dims; the
        # order of [[inputs]]/[[outputs]] is not, since tensors are bound by name.
        category = "info" if parts[-1] in ("inputs", "outputs") else "order"
        out.append(FieldDiff(path, ka, kb, category, CATEGORY_REASONS[category][0]))
    for k in common_a:
        _walk(ma[k], mb[k], f"{path}[{k}]", parts, out)
