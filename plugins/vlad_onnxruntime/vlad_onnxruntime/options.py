"""The ``onnxruntime`` backend's options, parsed once into a frozen :class:`OrtOptions`.

They come from the release manifest's ``[backend.options]`` (or ``release.options`` in the
config for an unsigned development release) and go through :func:`vlad.backend.parse_options`:
types, bounds, choices and unknown keys (with a "did you mean") are :mod:`vlad.schema`'s;
:func:`check` adds the rules of the provider list. Every problem is reported at once, in
one line naming the backend. The meaning of each option: :mod:`vlad_onnxruntime.backend`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from vlad.backend import parse_options
from vlad.schema import bounded, join, kind, on_partial, shown
from vlad_onnxruntime.gpu import DEFAULT_CACHE_DIR, Precision, provider_option_conflicts

CPU = "CPUExecutionProvider"
RUNTIME = "onnxruntime"

OptLevel = Literal["disable", "basic", "extended", "all"]
#: ``graph_optimization_level`` -> the name of ONNX Runtime's ``GraphOptimizationLevel``.
OPT_LEVELS: dict[str, str] = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


@dataclass(frozen=True)
class OrtOptions:
    """The backend options of one release (module doc; meanings in :mod:`vlad_onnxruntime.backend`)."""

    # Ordered; each item a provider name or [name, {provider options}] (TOML has no union
    # type, so the items are checked by check()).
    providers: tuple[Any, ...] = (CPU,)
    # {provider name: {option: value}}, merged over the options given inline in providers.
    provider_options: dict[str, Any] = field(default_factory=dict)
    precision: Precision = "fp32"
    cache_dir: str = str(DEFAULT_CACHE_DIR)  # TensorRT provider's engine cache root
    intra_op_threads: int | None = field(default=None, metadata=bounded(0))  # 0: ORT's default
    inter_op_threads: int | None = field(default=None, metadata=bounded(0))
    graph_optimization_level: OptLevel = "all"
    optimized_model_path: str | None = None
    check_node_placement: bool = True
    memory_map: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> OrtOptions:
        """Validate a TOML-shaped options table; every problem is reported at once."""
        return parse_options(RUNTIME, cls, options, check)

    def provider_list(self) -> tuple[list[str], list[dict[str, str]]]:
        """The requested providers in order, and one options dict per provider (strings, as
        ORT wants them); ``provider_options`` merged over the inline ones."""
        names: list[str] = []
        opts: list[dict[str, str]] = []
        for item in self.providers:
            name, inline = (item, {}) if isinstance(item, str) else (item[0], item[1])
            merged = {**inline, **(self.provider_options or {}).get(name, {})}  # None: did not parse
            names.append(name)
            opts.append({str(k): str(v) for k, v in merged.items()})
        return names, opts


@on_partial
def check(o: OrtOptions, path: str, problems: list[str]) -> None:
    """The provider list's rules: a non-empty list of names or [name, {options}] pairs, none
    twice; provider_options only for listed providers; no option the backend sets itself.
    Also run when other keys did not parse (every problem at once): then a key that did not
    parse is None here, and its rules are skipped."""
    if o.providers is None:
        return  # not an array: already a problem
    where, extra = join(path, "providers"), join(path, "provider_options")
    before = len(problems)
    if not o.providers:
        problems.append(f"{where}: must name at least one execution provider")
    names: list[str] = []
    for i, item in enumerate(o.providers):
        if isinstance(item, str) and item:
            name = item
        elif isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict):
            name = item[0]
        else:
            problems.append(f"{where}[{i}]: expected a provider name or [name, {{options}}], got {shown(item)}")
            continue
        if name in names:
            problems.append(f"{where}[{i}]: provider {name} is listed twice")
        names.append(name)
    for name, table in (o.provider_options or {}).items():
        if name not in names:
            problems.append(f"{extra}.{name}: {name} is not in providers {names}")
        elif not isinstance(table, dict):
            problems.append(f"{extra}.{name}: expected a table {{option = value}}, got {kind(table)}")
    if len(problems) > before:
        return  # a malformed list: which options conflict cannot be told yet
    listed, provider_opts = o.provider_list()
    problems.extend(f"{where}: {p}" for p in provider_option_conflicts(listed, provider_opts))
    device_id = provider_opts[0].get("device_id", "0")
    if not device_id.isdecimal():
        problems.append(f"{where}: {listed[0]} option device_id must be a GPU index (0, 1, ...), got {device_id!r}")
