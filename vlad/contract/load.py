"""Loading a contract: read the TOML file, parse it with :mod:`vlad.schema`, run the checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlad import schema
from vlad.contract.checks import CHECKS, check_cross
from vlad.contract.model import SUPPORTED_FORMATS, Contract
from vlad.errors import ContractError
from vlad.files import load_toml_or_raise


def load_contract(path: str | Path) -> Contract:
    """Read, parse and validate the contract file at ``path``.

    Raises :class:`ContractError` listing every problem found (unreadable file, invalid
    TOML, missing or unknown keys, bad values, inconsistencies between sections).
    The tokenizer file is not opened here; :attr:`Contract.tokenizer_path` locates it.
    """
    path = Path(path)
    source = str(path)
    data = load_toml_or_raise(
        path, lambda problem: ContractError(source, [problem]), "cannot read contract: no such file"
    )
    return parse_contract(data, source, path=path.resolve())


def parse_contract(data: dict[str, Any], source: str = "<contract>", *, path: Path | None = None) -> Contract:
    """Validate TOML-shaped ``data`` and build a :class:`Contract`.

    ``source`` names the data in error messages. ``path`` (the contract file) sets
    ``Contract.path`` and ``base_dir``, against which ``language.file`` is resolved.
    Raises :class:`ContractError` with every problem found.
    """
    problems: list[str] = []
    if not isinstance(data, dict):
        raise ContractError(source, [f"expected a table at top level, got {schema.kind(data)}"])
    values, complete = schema.parse_fields(Contract, data, "", problems, CHECKS)
    fmt = values.get("format")
    if fmt is not None and fmt not in SUPPORTED_FORMATS:
        problems.append(f"format: unsupported format {fmt!r} (this vlad reads: {', '.join(SUPPORTED_FORMATS)})")
    check_cross(values, problems)
    if problems or not complete:
        raise ContractError(source, problems)
    return Contract(**values, path=path, base_dir=path.parent if path is not None else None)
