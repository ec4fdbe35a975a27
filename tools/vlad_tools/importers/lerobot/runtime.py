"""The LeRobot environment the importer runs in: which LeRobot, on which torch, offline.

LeRobot 0.4.4 (the newest release for Python 3.11) pins ``torch<2.11`` and
``torchvision<0.26``; vlad pins ``torch==2.13.0``. LeRobot runs on vlad's torch: it is
installed without its dependencies (``scripts/bootstrap`` with the ``lerobot`` or ``dev``
extras) and the ones it imports come from the ``lerobot`` extra, with the torchvision
release built for torch 2.13.0 (docs/lerobot.md, "One torch"). Nothing here is imported
by the daemon.

PyPI's torchvision is a CUDA build; beside the CPU build of torch its compiled operators
(``torchvision::nms`` and friends, detection models only) cannot load, and its
``import`` then fails registering fake kernels for two of them. :func:`load_lerobot`
declares those two operator schemas first, only where the compiled library did not load,
so ``import torchvision`` works with its Python parts (models, transforms: all ACT and
Diffusion Policy use); calling one of those operators still fails loudly.

SmolVLA needs ``transformers`` (LeRobot 0.4.4 pins ``>=4.57.1,<5``). transformers 4.57.6 caps
``tokenizers`` at 0.23.0, a release that never came out; vlad runs tokenizers 0.23.3 (the
demo release's tokenizer pins its major.minor). So transformers is installed without its
dependencies too, and :func:`prepare_transformers` runs transformers' own import-time
version checks for every package but tokenizers, whose major.minor it checks against the
range transformers was built for; the importer then proves, every import, that vlad's
tokenizer gives LeRobot's token ids.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from vlad.errors import VladError

SUPPORTED = ("0.4.4",)  # LeRobot releases the importer is tested against

# torchvision's operators whose fake kernels are registered unconditionally at import.
_TORCHVISION_FAKE_OPS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


class LeRobotMissing(VladError):
    """LeRobot (or a part of it the checkpoint needs) is not installed here."""


def lerobot_version() -> str | None:
    """The installed LeRobot's version, or None."""
    try:
        return importlib.metadata.version("lerobot")
    except importlib.metadata.PackageNotFoundError:
        return None


def _torchvision_ops_loadable() -> bool:
    """Whether torchvision's compiled operator library loads beside this torch."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    lib = next(Path(spec.submodule_search_locations[0]).glob("_C*.so"), None)
    if lib is None:
        return False
    try:
        torch.ops.load_library(str(lib))
    except (OSError, RuntimeError):
        return False
    return True


def prepare_torchvision() -> None:
    """Make ``import torchvision`` work beside the CPU torch (see the module doc). Idempotent."""
    import torch

    if hasattr(torch.ops, "torchvision") and all(hasattr(torch.ops.torchvision, op) for op in _TORCHVISION_FAKE_OPS):
        return
    if _torchvision_ops_loadable():
        return
    for op, schema in _TORCHVISION_FAKE_OPS.items():
        torch.library.define(f"torchvision::{op}", schema)


# The tokenizers releases transformers 4.57 runs with (its table says <=0.23.0; 0.23.0 was never released).
_TOKENIZERS_SERIES = ("0.22", "0.23")


def prepare_transformers() -> None:
    """Make ``import transformers`` work beside tokenizers 0.23.x (see the module doc); idempotent.

    transformers runs ``transformers.dependency_versions_check`` on import, which refuses any
    tokenizers above 0.23.0. Where that is the only objection, the module is registered in
    its place with the same ``dep_version_check`` and the other checks are run right after
    the import, as transformers runs them."""
    if "transformers" in sys.modules or importlib.util.find_spec("transformers") is None:
        return
    try:
        tokenizers = importlib.metadata.version("tokenizers")
    except importlib.metadata.PackageNotFoundError:
        return
    if tokenizers == "0.23.0" or ".".join(tokenizers.split(".")[:2]) not in _TOKENIZERS_SERIES:
        return  # transformers' own check decides
    name = "transformers.dependency_versions_check"
    module = ModuleType(name, "transformers' import-time version checks, tokenizers checked by vlad")

    def dep_version_check(pkg: str, hint: str | None = None) -> None:
        from transformers.dependency_versions_table import deps
        from transformers.utils.versions import require_version

        require_version(deps[pkg], hint)

    module.dep_version_check = dep_version_check  # type: ignore[attr-defined]
    sys.modules[name] = module
    import transformers
    from transformers.dependency_versions_table import deps
    from transformers.utils.versions import require_version_core

    for pkg in ("python", "tqdm", "regex", "requests", "packaging", "filelock", "numpy", "huggingface-hub"):
        require_version_core(deps[pkg])
    for pkg in ("safetensors", "accelerate", "pyyaml"):
        if importlib.util.find_spec("yaml" if pkg == "pyyaml" else pkg) is not None:
            require_version_core(deps[pkg])
    del transformers


def load_lerobot() -> ModuleType:
    """Import LeRobot, offline, after checking its version; :class:`LeRobotMissing` otherwise."""
    version = lerobot_version()
    if version is None:
        raise LeRobotMissing(
            "LeRobot is not installed: run `scripts/bootstrap lerobot` (or `scripts/bootstrap dev`); see docs/lerobot.md"
        )
    if version not in SUPPORTED:
        raise LeRobotMissing(
            f"LeRobot {version} is installed; the importer supports {', '.join(SUPPORTED)}: "
            "run `scripts/bootstrap lerobot`"
        )
    # No model hub: everything comes from the checkpoint folder (a hub download would
    # otherwise be the silent fallback of a missing file).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        prepare_torchvision()
        prepare_transformers()
        import lerobot
        import lerobot.policies.factory  # noqa: F401  (registers the policy configs)
    except ImportError as exc:
        raise LeRobotMissing(
            f"LeRobot {version} cannot be imported ({exc}); run `scripts/bootstrap lerobot` to install what it needs"
        ) from exc
    return lerobot
