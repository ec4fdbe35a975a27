"""A release folder under test: its manifest, contract, tokenizer and serving backend.

Gates judge a release *before* it is signed (the evidence goes into the manifest that is
then signed), so the manifest is parsed and validated here without a signature check;
``vladctl deploy`` verifies the signature later as always.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlad.contract import Contract, load_contract
from vlad.errors import VladError
from vlad_tools.gates.plan import EngineSpec
from vlad_tools.gates.results import GateError


@dataclass
class Subject:
    """One release folder: what the gates load, run and name in the report."""

    path: Path
    id: str
    manifest: Any  # vlad.release.manifest.Manifest
    contract: Contract
    serving: EngineSpec
    _tokenizer: Any = field(default=None, repr=False)

    @property
    def document(self) -> dict[str, Any]:
        """The parsed manifest TOML (the mapping the signature covers)."""
        return dict(self.manifest.document)

    def tokenizer(self):
        """The contract's tokenizer (checked against its pinned sha256), loaded once."""
        if self._tokenizer is None and self.contract.language is not None:
            from vlad.processing import Tokenizer

            self._tokenizer = Tokenizer.from_contract(self.contract)
        return self._tokenizer

    def artifact_path(self, relpath: str) -> Path:
        """A file of the release, by its path relative to the folder."""
        return self.path / relpath

    def artifacts(self, suffixes: tuple[str, ...] = ()) -> list[str]:
        """Relative paths of the model artifacts (role ``model``), optionally by suffix."""
        return [
            a.path
            for a in self.manifest.artifacts
            if a.role in ("model", "engine") and (not suffixes or a.path.endswith(suffixes))
        ]

    def identity(self) -> dict[str, Any]:
        """What the evidence is about: the release id, its contract and its artifacts' hashes."""
        return {
            "path": str(self.path),
            "release_id": self.id,
            "contract_sha256": self.contract.sha256,
            "model": f"{self.contract.model.id}@{self.contract.model.version}",
            "serving": {
                "backend": self.serving.backend,
                "artifact": self.serving.artifact,
                "options": dict(self.serving.options),
            },
            "artifacts": {a.path: a.sha256 for a in self.manifest.artifacts if a.role != "report"},
        }


def open_subject(path: str | Path) -> Subject:
    """Open a release folder for gating; one clear :class:`GateError` if it cannot be."""
    from vlad.release.manifest import load_manifest

    folder = Path(path).resolve()
    if not folder.is_dir():
        raise GateError(f"{path}: no such release folder")
    try:
        manifest = load_manifest(folder)
    except VladError as exc:
        raise GateError(f"cannot gate {folder}: {exc}") from exc
    try:
        contract = load_contract(folder / manifest.contract.path)
    except VladError as exc:
        raise GateError(f"cannot gate {folder}: {exc}") from exc
    b = manifest.backend
    serving = EngineSpec(b.name, b.artifact, dict(b.options), str(b.options.get("precision", "")))
    return Subject(folder, manifest.release.id, manifest, contract, serving)
