"""The release contract: the frozen input/output contract of one model release.

A contract is a TOML file (format ``vlad.contract/1``, documented in docs/contract.md)
parsed once into frozen dataclasses (:mod:`vlad.contract.model`) whose attribute names are
the TOML keys. Loading (:mod:`vlad.contract.load`) validates everything
(:mod:`vlad.contract.checks`) and reports *every* problem in one
:class:`~vlad.errors.ContractError`, so a broken contract is fixed in one pass.
:func:`diff_contracts` (:mod:`vlad.contract.diff`) compares two contracts field by field
and says which differences break compatibility with the trained model.
"""

from vlad.contract.diff import CATEGORY_REASONS, FieldDiff, diff_contracts
from vlad.contract.load import load_contract, parse_contract
from vlad.contract.model import (
    CONTRACT_FORMAT,
    KNOWN_UNITS,
    UNITS_BY_SEMANTICS,
    ActionSpec,
    CameraSpec,
    Contract,
    DynamicAxis,
    HistorySpec,
    JointSpec,
    LanguageSpec,
    ModelImageSpec,
    ModelSpec,
    NoiseSpec,
    ProprioSpec,
    RawImageSpec,
    RtcSpec,
    TensorSpec,
    TimingSpec,
)

__all__ = [
    "CATEGORY_REASONS",
    "CONTRACT_FORMAT",
    "KNOWN_UNITS",
    "UNITS_BY_SEMANTICS",
    "ActionSpec",
    "CameraSpec",
    "Contract",
    "DynamicAxis",
    "FieldDiff",
    "HistorySpec",
    "JointSpec",
    "LanguageSpec",
    "ModelImageSpec",
    "ModelSpec",
    "NoiseSpec",
    "ProprioSpec",
    "RawImageSpec",
    "RtcSpec",
    "TensorSpec",
    "TimingSpec",
    "diff_contracts",
    "load_contract",
    "parse_contract",
]
