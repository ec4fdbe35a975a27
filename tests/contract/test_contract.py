"""Tests of vlad.contract (load, validate, diff) and vlad.contract_cli."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from vlad.cli.contract import add_contract_commands, main, main_contract_diff
from vlad.contract import (
    CONTRACT_FORMAT,
    Contract,
    FieldDiff,
    TensorSpec,
    diff_contracts,
    load_contract,
    parse_contract,
)
from vlad.errors import ContractError, VladError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "manifests" / "demo" / "contract.toml"
DEMO_TEXT = DEMO.read_text()


@pytest.fixture
def demo() -> Contract:
    return load_contract(DEMO)


@pytest.fixture
def data() -> dict:
    """The demo contract as raw TOML data, a fresh copy to break."""
    return copy.deepcopy(tomllib.loads(DEMO_TEXT))


def problems_of(data: dict) -> list[str]:
    with pytest.raises(ContractError) as info:
        parse_contract(data, "broken.toml")
    assert info.value.problems, "a ContractError must list its problems"
    return info.value.problems


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def edited(old: str, new: str, text: str = DEMO_TEXT, count: int = 1) -> str:
    """The demo text with ``old`` replaced; fails loudly if the demo changed shape."""
    assert text.count(old) >= count, f"demo contract no longer contains {old!r}"
    return text.replace(old, new, count)


# ---- loading the demo ---------------------------------------------------------------


def test_demo_contract_loads(demo: Contract) -> None:
    assert demo.format == CONTRACT_FORMAT
    assert demo.model.id == "vlad-demo-reacher"
    assert [c.name for c in demo.cameras] == ["overhead"]
    assert demo.cameras[0].model.mean == (0.5, 0.5, 0.5)
    assert demo.language is not None and demo.language.max_tokens == 8
    assert demo.proprio is not None and demo.proprio.dim == 4
    assert demo.noise is not None and demo.noise.shape == (50, 2)
    assert [j.name for j in demo.action.joints] == ["joint0", "joint1"]
    assert demo.timing.control_period_ms == 20.0
    assert [t.name for t in demo.inputs] == [
        "image_overhead",
        "tokens",
        "proprio",
        "noise",
        "rtc_actions",
        "rtc_weights",
    ]
    assert demo.rtc is not None and (demo.rtc.actions_input, demo.rtc.weights_input) == ("rtc_actions", "rtc_weights")


def test_demo_helpers(demo: Contract) -> None:
    image = demo.input("image_overhead")
    assert image.min_shape == (1, 3, 64, 64)
    assert image.opt_shape == image.shape == (1, 3, 64, 64)
    assert image.max_shape == (8, 3, 64, 64)
    assert image.accepts((4, 3, 64, 64)) and not image.accepts((9, 3, 64, 64))
    assert demo.output("actions").shape == (1, 50, 2)
    assert demo.tokenizer_path == DEMO.parent / "tokenizer.json"
    assert demo.base_dir == DEMO.parent
    with pytest.raises(KeyError, match="no input named 'nope'"):
        demo.input("nope")


def test_contract_is_frozen_and_hashable(demo: Contract) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        demo.format = "x"  # type: ignore[misc]
    assert hash(demo) == hash(load_contract(DEMO))


def test_sha256_ignores_layout_and_location(demo: Contract, tmp_path: Path) -> None:
    moved = write(tmp_path, "c.toml", "# a comment\n" + DEMO_TEXT.replace("255.0", "255"))
    other = load_contract(moved)
    assert other == demo
    assert other.sha256 == demo.sha256
    assert other.path != demo.path


def test_optional_sections_may_be_absent(data: dict) -> None:
    del data["language"]
    data["inputs"] = [t for t in data["inputs"] if t["name"] != "tokens"]
    contract = parse_contract(data)
    assert contract.language is None and contract.tokenizer_path is None


def test_dynamic_defaults_to_static(data: dict) -> None:
    for table in data["inputs"] + data["outputs"]:
        del table["dynamic"]
    contract = parse_contract(data)
    assert contract.input("tokens").dynamic == ()
    assert contract.input("tokens").max_shape == (1, 8)


# ---- broken contracts: each problem names its field -----------------------------------


def test_missing_field(data: dict) -> None:
    del data["model"]["version"]
    assert problems_of(data) == ["model.version: missing"]


def test_missing_section(data: dict) -> None:
    del data["timing"]
    assert problems_of(data) == ["timing: missing"]


def test_unknown_key_is_reported_with_suggestion(data: dict) -> None:
    data["action"]["joints"][1]["rate_limt"] = data["action"]["joints"][1].pop("rate_limit")
    data["extra_section"] = {}
    problems = problems_of(data)
    assert "action.joints[1].rate_limt: unknown key (did you mean 'rate_limit'?)" in problems
    assert "action.joints[1].rate_limit: missing" in problems
    assert any(p.startswith("extra_section: unknown key") for p in problems)


def test_wrong_type(data: dict) -> None:
    data["cameras"][0]["raw"]["height"] = 64.0
    data["timing"]["control_period_ms"] = "20"
    data["noise"]["seed"] = True
    problems = problems_of(data)
    assert "cameras[0].raw.height: expected an integer, got a float" in problems
    assert "timing.control_period_ms: expected a number, got a string" in problems
    assert "noise.seed: expected an integer, got a boolean" in problems


def test_unknown_unit(data: dict) -> None:
    data["action"]["joints"][1]["unit"] = "furlong"
    (problem,) = problems_of(data)
    assert problem.startswith("action.joints[1].unit: unknown unit 'furlong' (known: rad, ")


def test_unit_must_fit_semantics(data: dict) -> None:
    data["action"]["joints"][0]["unit"] = "rad/s"
    (problem,) = problems_of(data)
    assert problem.startswith("action.joints[0].unit: unit 'rad/s' does not fit semantics")


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        (("cameras", 0, "raw"), "color_order", "RGBA"),
        (("cameras", 0, "model"), "layout", "WHC"),
        (("cameras", 0, "model"), "resize", "bicubic"),
        (("language",), "padding_side", "middle"),
        (("noise",), "seeding", "random"),
        (("action",), "on_bound_violation", "ignore"),
        (("action", "joints", 0), "semantics", "acceleration"),
        (("inputs", 1), "dtype", "int128"),
    ],
)
def test_bad_enum_value(data: dict, where: tuple, key: str, value: str) -> None:
    table = data
    for part in where:
        table = table[part]
    table[key] = value
    path = ".".join(f"[{p}]" if isinstance(p, int) else p for p in where).replace(".[", "[")
    problems = problems_of(data)
    assert any(p.startswith(f"{path}.{key}: unknown value {value!r} (known: ") for p in problems)


def test_unknown_format(data: dict) -> None:
    data["format"] = "vlad.contract/2"
    (problem,) = problems_of(data)
    assert problem.startswith("format: unsupported format 'vlad.contract/2'")


def test_dynamic_min_greater_than_max(data: dict) -> None:
    data["inputs"][1]["dynamic"][0].update(min=4, max=2)
    problems = problems_of(data)
    assert any(p.startswith("inputs[1].dynamic[0]: needs min <= opt <= max") for p in problems)


def test_dynamic_axis_out_of_rank_and_opt_mismatch(data: dict) -> None:
    data["inputs"][2]["dynamic"] = [{"axis": 5, "name": "x", "min": 1, "opt": 1, "max": 2}]
    data["inputs"][3]["dynamic"][0]["opt"] = 2
    problems = problems_of(data)
    assert any(p.startswith("inputs[2].dynamic[0].axis: 5 is outside") for p in problems)
    assert any(p.startswith("inputs[3].dynamic[0].opt: 2 differs from shape[0]") for p in problems)


def test_inconsistent_image_shape(data: dict) -> None:
    data["inputs"][0]["shape"] = [1, 3, 32, 32]
    problems = problems_of(data)
    assert any(
        p.startswith("inputs[0].shape: [1, 3, 32, 32] does not match cameras[0].model")
        and "expected [N, 3, 64, 64]" in p
        for p in problems
    )


def test_image_layout_and_dtype_must_match_camera(data: dict) -> None:
    data["cameras"][0]["model"]["layout"] = "HWC"
    data["cameras"][0]["model"]["dtype"] = "float16"
    problems = problems_of(data)
    assert any(p.startswith("inputs[0].layout: 'NCHW' but cameras[0].model") for p in problems)
    assert any(p.startswith("inputs[0].shape:") and "[N, 64, 64, 3]" in p for p in problems)
    assert any(p.startswith("inputs[0].dtype: 'float32' differs") for p in problems)


def test_inconsistent_lengths(data: dict) -> None:
    data["proprio"]["names"].pop()
    data["proprio"]["std"][1] = 0.0
    data["cameras"][0]["model"]["mean"] = [0.5, 0.5]
    data["action"]["dim"] = 3
    problems = problems_of(data)
    assert "proprio.names: has 3 entries, expected dim = 4" in problems
    assert "proprio.std[1]: must be > 0, got 0.0" in problems
    assert "cameras[0].model.mean: has 2 values, expected 3 (one per color channel)" in problems
    assert "action.joints: has 2 joints, expected dim = 3" in problems
    assert any(p.startswith("outputs[0].shape: [1, 50, 2] does not match action") for p in problems)


def test_language_and_noise_wiring(data: dict) -> None:
    data["language"]["max_tokens"] = 16
    data["inputs"][1]["dtype"] = "float32"
    data["noise"]["dtype"] = "float16"
    problems = problems_of(data)
    assert any(p.startswith("inputs[1].shape: [1, 8] does not match language") for p in problems)
    assert any(p.startswith("inputs[1].dtype: 'float32' but token ids") for p in problems)
    assert "inputs[3].dtype: 'float32' differs from noise.dtype 'float16'" in problems


def test_undeclared_and_unconsumed_inputs(data: dict) -> None:
    data["proprio"]["input"] = "state"
    data["noise"]["input"] = "tokens"
    problems = problems_of(data)
    assert any(p.startswith("proprio.input: 'state' is not declared in [[inputs]]") for p in problems)
    assert "noise.input: 'tokens' is already consumed by language.input" in problems
    assert any(p.startswith("inputs[2].name: input 'proprio' is not consumed") for p in problems)
    assert any(p.startswith("inputs[3].name: input 'noise' is not consumed") for p in problems)


def test_action_output_must_be_declared(data: dict) -> None:
    data["action"]["output"] = "act"
    (problem,) = problems_of(data)
    assert problem.startswith("action.output: 'act' is not declared in [[outputs]]")


def test_duplicates_bounds_and_timing(data: dict) -> None:
    data["action"]["joints"][1]["name"] = "joint0"
    data["action"]["joints"][0].update(lower=1.0, upper=-1.0, rate_limit=0.0)
    data["timing"]["action_validity_ms"] = 10.0
    data["timing"]["e2e_deadline_ms"] = -1.0
    problems = problems_of(data)
    assert "action.joints[1]: duplicate joint name 'joint0'" in problems
    assert any(p.startswith("action.joints[0].lower: must be < upper") for p in problems)
    assert "action.joints[0].rate_limit: must be > 0, got 0.0" in problems
    assert any(p.startswith("timing.action_validity_ms: 10.0 is shorter") for p in problems)
    assert "timing.e2e_deadline_ms: must be > 0, got -1.0" in problems


def test_batch_ranges_must_agree(data: dict) -> None:
    data["outputs"][0]["dynamic"][0]["max"] = 4
    (problem,) = problems_of(data)
    assert problem.startswith("outputs[0]: batch axis (min, opt, max) (1, 1, 4) differs")


def test_all_problems_reported_together(data: dict) -> None:
    del data["model"]["version"]
    data["cameras"][0]["raw"]["color_order"] = "RGBX"
    data["action"]["joints"][1]["unit"] = "furlong"
    data["inputs"][1]["dynamic"][0].update(min=4, max=2)
    data["typo"] = 1
    with pytest.raises(ContractError) as info:
        parse_contract(data, "broken.toml")
    exc = info.value
    assert isinstance(exc, VladError)
    fields = [p.split(":")[0] for p in exc.problems]
    for expected in (
        "model.version",
        "cameras[0].raw.color_order",
        "action.joints[1].unit",
        "inputs[1].dynamic[0]",
        "typo",
    ):
        assert expected in fields
    assert str(exc).startswith(f"broken.toml: {len(exc.problems)} problems: ")
    assert "\n" not in str(exc)


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="cannot read contract"):
        load_contract(tmp_path / "missing.toml")
    with pytest.raises(ContractError, match="not valid TOML"):
        load_contract(write(tmp_path, "bad.toml", "format = \n"))


def test_broken_file_names_its_source(tmp_path: Path) -> None:
    path = write(tmp_path, "c.toml", edited('unit = "rad"', 'unit = "furlong"'))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert info.value.source == str(path)
    assert info.value.problems[0].startswith("action.joints[0].unit: unknown unit 'furlong'")


# ---- diff -----------------------------------------------------------------------------


def _replace(contract: Contract, path: str, value: object) -> Contract:
    """A copy of ``contract`` with the dotted ``path`` (``a.b[0].c``) set to ``value``."""
    head, _, rest = path.partition(".")
    name, _, index = head.partition("[")
    current = getattr(contract, name)
    if index:
        i = int(index.rstrip("]"))
        items = list(current)
        items[i] = _replace(items[i], rest, value) if rest else value
        return dataclasses.replace(contract, **{name: tuple(items)})
    new = _replace(current, rest, value) if rest else value
    return dataclasses.replace(contract, **{name: new})


def only(diffs: list[FieldDiff]) -> FieldDiff:
    assert len(diffs) == 1, diffs
    return diffs[0]


def test_diff_identical_is_empty(demo: Contract) -> None:
    assert diff_contracts(demo, demo) == []
    assert diff_contracts(demo, load_contract(DEMO)) == []


@pytest.mark.parametrize(
    ("path", "value", "diff_path", "category"),
    [
        ("inputs[1].dtype", "int32", "inputs[tokens].dtype", "dtype"),
        ("cameras[0].model.mean", (0.4, 0.5, 0.5), "cameras[overhead].model.mean", "normalization"),
        ("cameras[0].model.height", 32, "cameras[overhead].model.height", "shape"),
        ("action.joints[1].unit", "deg", "action.joints[joint1].unit", "unit"),
        ("action.frame", "base", "action.frame", "frame"),
        ("proprio.frame", "world", "proprio.frame", "frame"),
        ("action.joints[0].semantics", "delta", "action.joints[joint0].semantics", "semantics"),
        ("language.sha256", "1" * 64, "language.sha256", "normalization"),
        ("cameras[0].raw.color_order", "BGR", "cameras[overhead].raw.color_order", "color_order"),
        ("inputs[0].dynamic[0].max", 4, "inputs[image_overhead].dynamic[0].max", "shape"),
        ("action.chunk_length", 16, "action.chunk_length", "shape"),
    ],
)
def test_diff_breaking(demo: Contract, path: str, value: object, diff_path: str, category: str) -> None:
    d = only(diff_contracts(demo, _replace(demo, path, value)))
    assert (d.path, d.category, d.breaking) == (diff_path, category, True)
    assert d.new == (list(value) if isinstance(value, tuple) else value)


def test_diff_joint_order_is_breaking(demo: Contract) -> None:
    swapped = _replace(demo, "action.joints", demo.action.joints[::-1])
    d = only(diff_contracts(demo, swapped))
    assert (d.path, d.old, d.new) == ("action.joints", ["joint0", "joint1"], ["joint1", "joint0"])
    assert d.category == "order" and d.breaking


def test_diff_proprio_order_is_breaking(demo: Contract) -> None:
    assert demo.proprio is not None
    names = demo.proprio.names
    d = only(diff_contracts(demo, _replace(demo, "proprio.names", (names[1], names[0], *names[2:]))))
    assert (d.path, d.category, d.breaking) == ("proprio.names", "order", True)


def test_diff_removed_joint_and_section(demo: Contract) -> None:
    fewer = _replace(demo, "action.joints", demo.action.joints[:1])
    fewer = _replace(fewer, "action.dim", 1)
    paths = {d.path: d for d in diff_contracts(demo, fewer)}
    assert paths["action.joints[joint1]"].new is None
    assert paths["action.joints[joint1]"].category == "structure"
    assert paths["action.joints[joint1]"].breaking
    no_noise = _replace(demo, "noise", None)
    d = only(diff_contracts(demo, no_noise))
    assert (d.path, d.new, d.breaking) == ("noise", None, True)


@pytest.mark.parametrize(
    ("path", "value", "category"),
    [
        ("model.version", "1.0.1", "info"),
        ("model.description", "retrained", "info"),
        ("timing.e2e_deadline_ms", 25.0, "timing"),
        ("action.joints[0].upper", 3.5, "safety"),
        ("action.joints[1].rate_limit", 0.1, "safety"),
        ("noise.seed", 7, "info"),
    ],
)
def test_diff_non_breaking(demo: Contract, path: str, value: object, category: str) -> None:
    d = only(diff_contracts(demo, _replace(demo, path, value)))
    assert (d.category, d.breaking) == (category, False)


def test_diff_tensor_order_is_not_breaking(demo: Contract) -> None:
    d = only(diff_contracts(demo, _replace(demo, "inputs", demo.inputs[::-1])))
    assert (d.path, d.category, d.breaking) == ("inputs", "info", False)


# ---- CLI ------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vladctl")
    add_contract_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_diff_identical(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["contract", "diff", str(DEMO), str(DEMO)])
    assert args.func is main_contract_diff
    assert main_contract_diff(args) == 0
    assert "identical" in capsys.readouterr().out


def test_cli_diff_non_breaking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = write(tmp_path, "new.toml", edited('version = "1.0.0"', 'version = "1.0.1"'))
    assert main_contract_diff(parse(["contract", "diff", str(DEMO), str(new)])) == 0
    out = capsys.readouterr().out
    assert "model.version" in out and "1.0.0 → 1.0.1" in out and "ok (info)" in out


def test_cli_diff_breaking_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = write(tmp_path, "new.toml", edited("mean = [0.5, 0.5, 0.5]", "mean = [0.4, 0.4, 0.4]"))
    assert main_contract_diff(parse(["contract", "diff", str(DEMO), str(new), "--json"])) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["breaking"] == 1
    (diff,) = report["diffs"]
    assert diff["path"] == "cameras[overhead].model.mean"
    assert diff["old"] == [0.5, 0.5, 0.5] and diff["new"] == [0.4, 0.4, 0.4]
    assert diff["breaking"] is True and diff["category"] == "normalization"


def test_cli_diff_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, "bad.toml", edited('unit = "rad"', 'unit = "furlong"'))
    assert main_contract_diff(parse(["contract", "diff", str(DEMO), str(bad)])) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "unknown unit 'furlong'" in captured.err


def test_cli_check_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contract", "check", str(DEMO)]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["contract", "show", str(DEMO)]) == 0
    assert "joint1: position [rad]" in capsys.readouterr().out
    assert main(["contract", "show", "--json", str(DEMO)]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["version"] == "1.0.0"
    text = edited('unit = "rad"', 'unit = "furlong"', edited("dim = 2", "dim = 3"))
    bad = write(tmp_path, "bad.toml", text)
    assert main(["contract", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "action.joints[0].unit: unknown unit 'furlong'" in err
    assert "action.joints: has 2 joints, expected dim = 3" in err


def test_cli_as_module_subprocess(tmp_path: Path) -> None:
    new = write(tmp_path, "new.toml", edited('frame = "joint"\nscale', 'frame = "base"\nscale'))
    proc = subprocess.run(
        [sys.executable, "-m", "vlad.cli", "contract", "diff", str(DEMO), str(new)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "action.frame" in proc.stdout and "BREAKING (frame)" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_tensor_spec_shapes_without_dynamic() -> None:
    t = TensorSpec(name="x", dtype="float32", layout="ND", shape=(2, 3))
    assert t.min_shape == t.opt_shape == t.max_shape == (2, 3)


def test_every_contract_key_is_documented() -> None:
    """docs/contract.md names every key of the format (meta-test: no silent additions)."""
    import vlad.contract as module

    doc = (ROOT / "docs" / "contract.md").read_text()
    schema = [getattr(module, n) for n in module.__all__ if dataclasses.is_dataclass(getattr(module, n))]
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in schema
        if cls is not FieldDiff
        for f in dataclasses.fields(cls)
        if not f.metadata.get("internal")
        and f"`{f.name}`" not in doc
        # sections are written `[model]`, `[cameras.raw]`, `[[action.joints]]`
        and not re.search(rf"[\[.]{f.name}\]+`", doc)
    ]
    assert not missing
