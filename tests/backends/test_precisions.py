"""One set of precision labels (vlad.backend.PRECISIONS): every backend honours a subset of
it, the manifest accepts all of it, the gates hold a budget for each label."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "module",
    ["vlad_torch.session", "vlad_onnxruntime.gpu", "vlad_tensorrt.precision"],
)
def test_every_backend_honours_a_subset_of_the_shared_labels(module):
    import importlib

    from vlad.backend import PRECISIONS

    honoured = importlib.import_module(module).PRECISIONS
    assert set(honoured) <= set(PRECISIONS), f"{module} knows labels vlad.backend.PRECISIONS lacks"
    assert "tf32" in honoured  # a label a signed manifest may ask for


def test_manifest_and_gates_share_the_label_set():
    from vlad.backend import PRECISIONS
    from vlad.release.manifest import _check_options
    from vlad_tools.gates.plan import DEFAULT_BUDGETS
    from vlad_tools.gates.plan import PRECISIONS as plan_labels

    assert plan_labels is PRECISIONS and set(DEFAULT_BUDGETS) == set(PRECISIONS)
    for label in PRECISIONS:
        problems: list[str] = []
        _check_options({"precision": label}, problems)
        assert problems == []
    problems = []
    _check_options({"precision": "fp4"}, problems)
    assert problems == ["backend.options.precision: unknown precision 'fp4' (known: " + ", ".join(PRECISIONS) + ")"]


def test_the_lerobot_importer_exports_a_subset_of_the_shared_labels():
    from vlad.backend import PRECISIONS
    from vlad_tools.importers.lerobot.importer import PRECISIONS as exported

    assert exported and set(exported) <= set(PRECISIONS)
