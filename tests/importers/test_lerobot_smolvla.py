"""SmolVLA through the LeRobot importer, against LeRobot itself: a tiny random-weight SmolVLA
checkpoint written by LeRobot (its VLM folder built by transformers, offline), LeRobot's own
``preprocessor -> predict_action_chunk -> postprocessor`` as the reference, the release's
tokenizer against LeRobot's, real-time chunking by inpainting, the VLM folder's one-line
errors, and (slow) the import served by a real ``vlad serve``.

Skipped, with the reason, where LeRobot or transformers is not installed (``scripts/bootstrap
dev`` installs both: docs/lerobot.md).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil

import numpy as np
import pytest

from vlad_tools.importers.lerobot.runtime import lerobot_version

if lerobot_version() is None or importlib.util.find_spec("transformers") is None:
    pytest.skip(
        "LeRobot or transformers is not installed: scripts/bootstrap dev installs both", allow_module_level=True
    )

from tests.importers.test_lerobot_import import LOADED_CI, SO101_UNITS, _frames, _serve_and_compare  # noqa: E402
from vlad.contract import load_contract  # noqa: E402
from vlad.processing import Tokenizer, decode_actions  # noqa: E402
from vlad_tools.importers.lerobot.checkpoint import CheckpointError, read_checkpoint  # noqa: E402
from vlad_tools.importers.lerobot.contract import ContractOptions, contract_data, contract_toml  # noqa: E402
from vlad_tools.importers.lerobot.fixtures import synthetic_windows  # noqa: E402
from vlad_tools.importers.lerobot.importer import ImportOptions, _noise, _vlad_window, import_checkpoint  # noqa: E402
from vlad_tools.importers.lerobot.policies import Frame, export_module, lerobot_reference, load_policy  # noqa: E402
from vlad_tools.importers.lerobot.vlm import language_table, read_vlm_dir, write_release_tokenizer  # noqa: E402
from vlad_tools.testing.lerobot import SO101, TINY_VLM, make_checkpoint, make_vlm_folder  # noqa: E402

HUB = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
OPTS = ContractOptions(release_id="smolvla-t", fps=30, state_units=SO101_UNITS, action_units=SO101_UNITS)
# Small enough to build, run and export in seconds: 2 of the tiny VLM's 4 text layers, 2 flow steps.
SMALL = {"num_vlm_layers": 2, "num_steps": 2, "chunk_size": 8, "n_action_steps": 8}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny VLM folder and a SmolVLA checkpoint trained from it (SO-101-shaped: two cameras
    of different sizes, 6-D state and action), its config naming the hub model as a real one does."""
    root = tmp_path_factory.mktemp("smolvla")
    vlm = make_vlm_folder(root / "vlm")
    ckpt = make_checkpoint(root / "ckpt", "smolvla", robot=SO101, vlm_model_name=vlm, hub_name=HUB, **SMALL)
    return vlm, ckpt


@pytest.fixture(scope="module")
def loaded(tiny, tmp_path_factory):
    vlm_dir, path = tiny
    ckpt = read_checkpoint(path)
    vlm = read_vlm_dir(vlm_dir, ckpt)
    folder = tmp_path_factory.mktemp("release")
    sha = write_release_tokenizer(vlm, folder / "tokenizer.json")
    data = contract_data(ckpt, None, OPTS, None, language_table(vlm, sha, int(ckpt.config["tokenizer_max_length"])))
    (folder / "contract.toml").write_text(contract_toml(data))
    contract = load_contract(folder / "contract.toml")
    policy, pre, post = load_policy(ckpt, vlm.path)
    module = export_module(policy, ckpt, [t.name for t in contract.inputs], vlm.pad_id)
    return ckpt, contract, Tokenizer.from_contract(contract), policy, pre, post, module


def _names(ckpt) -> dict[str, str]:
    return {c.key.removeprefix("observation.images."): c.key.removeprefix("observation.images.") for c in ckpt.cameras}


def _run(module, contract, inputs):
    import torch

    with torch.inference_mode():
        return module(*(torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in contract.inputs)).numpy()


def test_the_contract_reads_an_instruction_with_the_vlms_tokenizer(loaded):
    ckpt, contract, *_ = loaded
    assert contract.model.family == "lerobot-smolvla"
    lang = contract.language
    assert lang is not None and lang.tokenizer == HUB and lang.max_tokens == 16 and lang.truncation == "truncate"
    assert lang.padding_side == "right" and lang.pad_id == 2  # the tokenizer's <|im_end|>
    assert contract.noise is not None and contract.noise.shape == (8, 32) and contract.noise.denoising_steps == 2
    assert contract.rtc is not None and contract.rtc.method == "inpaint"
    assert [t.name for t in contract.inputs] == [
        "image_front",
        "image_wrist",
        "tokens",
        "state",
        "noise",
        "rtc_actions",
        "rtc_weights",
    ]
    assert [(c.name, c.model.height, c.model.width, c.model.resize) for c in contract.cameras] == [
        ("front", 48, 64, "none"),
        ("wrist", 36, 48, "none"),
    ]  # LeRobot's resize with padding (to 64x64) is part of the graph


def test_the_export_module_and_the_tokenizer_compute_what_lerobot_computes(loaded):
    """vlad's preprocessing with the release's tokenizer gives LeRobot's token ids (instructions
    with punctuation, a trailing newline or space, non-ASCII letters) and the module LeRobot's
    chunk for the same noise, normalized and per joint."""
    ckpt, contract, tokenizer, policy, pre, post, module = loaded
    windows = synthetic_windows(ckpt, 6, seed=3)
    assert len({w[-1].task for w in windows}) == 6
    chunks = []
    for k, window in enumerate(windows):
        noise = _noise(ckpt, contract, 100 + k)
        ref = lerobot_reference(policy, pre, post, ckpt, window, noise)
        inputs = _vlad_window(contract, window, _names(ckpt), 100 + k, tokenizer)
        inputs["noise"] = noise
        want = ref.inputs["observation.language.tokens"][0]
        assert inputs["tokens"][0, : len(want)].tolist() == want.tolist(), window[-1].task
        assert (inputs["tokens"][0, len(want) :] == 2).all()
        np.testing.assert_allclose(inputs["state"], ref.inputs["observation.state"], atol=1e-6)
        out = _run(module, contract, inputs)
        assert out.shape == ref.output.shape == (1, 8, 6)
        np.testing.assert_allclose(out, ref.output, atol=5e-5)
        actions = decode_actions(contract, {"actions": out})
        np.testing.assert_allclose(actions, ref.actions, atol=5e-5 * max(j.std for j in contract.action.joints))
        chunks.append(ref.output)
    assert min(np.abs(a - b).max() for a, b in zip(chunks, chunks[1:], strict=False)) > 1e-3  # not vacuous


def test_the_instruction_changes_the_chunk_as_in_lerobot(loaded):
    """Same images, state and noise, two instructions: LeRobot's chunks differ, and vlad's
    follow them: the language reaches the graph through the release's tokenizer."""
    ckpt, contract, tokenizer, policy, pre, post, module = loaded
    frame = synthetic_windows(ckpt, 1, seed=5)[0][0]
    noise = _noise(ckpt, contract, 7)
    outs = []
    for task in ("pick up the red cube and put it in the box", "stack the blocks"):
        window = [Frame(frame.images, frame.state, task)]
        ref = lerobot_reference(policy, pre, post, ckpt, window, noise)
        inputs = {**_vlad_window(contract, window, _names(ckpt), 7, tokenizer), "noise": noise}
        np.testing.assert_allclose(_run(module, contract, inputs), ref.output, atol=5e-5)
        outs.append(ref.output)
    assert np.abs(outs[0] - outs[1]).max() > 1e-3


def test_real_time_chunking_inpaints_and_zero_weights_are_the_plain_chunk(loaded):
    ckpt, contract, tokenizer, policy, pre, post, module = loaded
    window = synthetic_windows(ckpt, 1, seed=9)[0]
    inputs = {**_vlad_window(contract, window, _names(ckpt), 11, tokenizer), "noise": _noise(ckpt, contract, 11)}
    plain = _run(module, contract, inputs)
    ref = lerobot_reference(policy, pre, post, ckpt, window, inputs["noise"])
    np.testing.assert_allclose(plain, ref.output, atol=5e-5)
    target = plain + 0.5
    weights = np.zeros((1, 8), np.float32)
    weights[:, :3] = 1.0
    guided = _run(module, contract, {**inputs, "rtc_actions": target, "rtc_weights": weights})
    np.testing.assert_allclose(guided[:, :3], target[:, :3], atol=1e-6)  # weight 1: reproduced
    assert np.abs(guided[:, 3:] - plain[:, 3:]).max() > 1e-4  # the free waypoints follow the guide
    half = _run(module, contract, {**inputs, "rtc_actions": target, "rtc_weights": weights * 0.5})
    assert 0 < np.abs(half[:, :3] - target[:, :3]).max() < np.abs(plain[:, :3] - target[:, :3]).max()


@pytest.fixture(scope="module")
def guided_release(loaded, tmp_path_factory):
    """policy.pt2 and the flow head's programs (real-time chunking by guidance) of the tiny
    SmolVLA, beside its contract and tokenizer, with one check window and LeRobot's answer."""
    from vlad.release.export import export_program
    from vlad_tools.importers.lerobot.importer import _export_flow_head

    ckpt, contract, tokenizer, policy, pre, post, module = loaded
    folder = tmp_path_factory.mktemp("guided")
    for name in ("contract.toml", "tokenizer.json"):
        shutil.copy(contract.path.parent / name, folder / name)
    window = synthetic_windows(ckpt, 1, seed=9)[0]
    inputs = {**_vlad_window(contract, window, _names(ckpt), 11, tokenizer), "noise": _noise(ckpt, contract, 11)}
    export_program(module, contract, inputs, folder / "policy.pt2")
    _export_flow_head(module, contract, inputs, folder)
    return folder, inputs, lerobot_reference(policy, pre, post, ckpt, window, inputs["noise"])


def test_guided_real_time_chunking_on_the_torch_backend(loaded, guided_release):
    """The flow head's programs as the torch backend integrates them: with zero weights
    LeRobot's plain chunk; weighted towards waypoints 0.5 off it over the first half, the
    guidance written in LeRobot's own time over its eager modules, the weighted waypoints
    much closer (guidance pulls, it does not overwrite) and the free ones moved."""
    from vlad_tools.importers.lerobot.importer import GUIDED, GUIDED_RUN, _check_artifacts, _check_guidance
    from vlad_torch import TorchBackend

    ckpt, contract, *_, module = loaded
    folder, inputs, ref = guided_release
    with TorchBackend().load(folder / "policy.pt2", contract, GUIDED) as session:
        plain = session.infer(inputs)["actions"]
    assert plain.shape == (1, 8, 6)
    np.testing.assert_allclose(plain, ref.output, atol=1e-5)
    checks = _check_artifacts(contract, folder, [(inputs, ref)], (GUIDED_RUN,))
    guided = checks["torch guided (policy_encoder.pt2, policy_velocity.pt2)"]
    assert guided.output.max_abs <= 1e-5 and not guided.problems("guided", contract)
    problems: list[str] = []
    report = _check_guidance(contract, module, folder, inputs, problems)
    assert problems == []
    assert report["held"] == 4 and report["vs_reference_max_abs"] <= 1e-5
    assert report["weight_1_mean_abs_before"] == pytest.approx(0.5, abs=1e-6)
    assert report["weight_1_mean_abs_after"] < 0.25 * report["weight_1_mean_abs_before"], report
    assert report["free_changed_max_abs"] > 1e-3, report


def test_a_flow_head_left_in_lerobots_time_is_caught(loaded, guided_release, tmp_path, monkeypatch):
    """The velocity exported without the time conversion (LeRobot's ``denoise_step(x, t)``):
    the import's checks against LeRobot's plain chunk and the guidance in its time fail."""
    import torch

    from vlad_tools.importers.lerobot.importer import GUIDED_RUN, _check_artifacts, _check_guidance, _export_flow_head

    ckpt, contract, *_, module = loaded
    folder, inputs, ref = guided_release
    heads = type(module).flow_head

    class Unconverted(torch.nn.Module):
        def __init__(self, velocity) -> None:
            super().__init__()
            self.velocity = velocity

        def forward(self, *args):
            *rest, t = args
            return -self.velocity(*rest, 1.0 - t)

    monkeypatch.setattr(type(module), "flow_head", lambda self: (heads(self)[0], Unconverted(heads(self)[1])))
    shutil.copy(folder / "policy.pt2", tmp_path / "policy.pt2")
    _export_flow_head(module, contract, inputs, tmp_path)
    checks = _check_artifacts(contract, tmp_path, [(inputs, ref)], (GUIDED_RUN,))
    assert checks["torch guided (policy_encoder.pt2, policy_velocity.pt2)"].problems("guided", contract)
    problems: list[str] = []
    _check_guidance(contract, module, tmp_path, inputs, problems)
    assert any("differ from the guidance in LeRobot's time" in p for p in problems), problems


def test_the_manifest_of_a_torch_release_names_the_flow_head(loaded, guided_release, tmp_path):
    """--backend torch: the manifest's options run the guided flow (the contract keeps its
    inpainting, which policy.onnx and a plain torch session use); served from the manifest,
    zero weights give LeRobot's chunk. Guidance is a SmolVLA choice on the torch backend."""
    from vlad.plugins import get_backend
    from vlad.release.manifest import load_manifest
    from vlad_tools.importers.lerobot.importer import _write_manifest

    ckpt, contract, *_ = loaded
    folder, inputs, ref = guided_release
    release = tmp_path / "release"
    shutil.copytree(folder, release)
    _write_manifest(release, release, ckpt, contract, ImportOptions(contract=OPTS, backend="torch"), lambda _: None)
    manifest = load_manifest(release / "manifest.toml")
    assert manifest.backend.name == "torch" and manifest.backend.artifact == "policy.pt2"
    assert dict(manifest.backend.options) == {
        "rtc_encoder": "policy_encoder.pt2",
        "rtc_velocity": "policy_velocity.pt2",
    }
    assert {"policy_encoder.pt2", "policy_velocity.pt2"} <= {a.path for a in manifest.artifacts}
    loaded_contract = load_contract(release / "contract.toml")
    assert loaded_contract.rtc is not None and loaded_contract.rtc.method == "inpaint"
    with get_backend("torch").load(release / "policy.pt2", loaded_contract, manifest.backend.options) as session:
        np.testing.assert_allclose(session.infer(inputs)["actions"], ref.output, atol=1e-5)

    assert ImportOptions(contract=OPTS).guided(ckpt) is False  # onnxruntime: the graph's inpainting
    assert ImportOptions(contract=OPTS, backend="torch", rtc_guidance=False).guided(ckpt) is False
    with pytest.raises(CheckpointError, match="a SmolVLA served by the torch backend"):
        ImportOptions(contract=OPTS, rtc_guidance=True).guided(ckpt)


def _copy(src, dst, drop=(), config=None):
    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    if config is not None:
        data = json.loads((dst / "config.json").read_text())
        config(data)
        (dst / "config.json").write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda vlm, tmp: tmp / "nowhere", "nowhere: no such folder (a local copy of " + HUB),
        (lambda vlm, tmp: None, f"SmolVLA needs its vision-language model's folder: pass --vlm-dir DIR with {HUB}'s"),
        (lambda vlm, tmp: _copy(vlm, tmp / "v", drop=["tokenizer.json"]), "missing tokenizer.json (its tokenizer)"),
        (
            lambda vlm, tmp: _copy(vlm, tmp / "v", drop=["tokenizer_config.json", "preprocessor_config.json"]),
            "missing tokenizer_config.json (its tokenizer's settings (special tokens)), preprocessor_config.json",
        ),
        (
            lambda vlm, tmp: _copy(vlm, tmp / "v", config=lambda c: c["text_config"].update(hidden_size=960)),
            "config.json text_config.hidden_size is 960, the checkpoint's weights have 128 (text width): not the VLM "
            f"this checkpoint was trained from ({HUB})",
        ),
        (
            lambda vlm, tmp: _copy(vlm, tmp / "v", config=lambda c: c["vision_config"].update(image_size=512)),
            "vision_config.image_size / patch_size squared is 1024, the checkpoint's weights have 16 (image patches)",
        ),
        (
            lambda vlm, tmp: _copy(vlm, tmp / "v", config=lambda c: c.update(model_type="idefics3")),
            "config.json describes a 'idefics3' model, SmolVLA needs 'smolvlm'",
        ),
    ],
    ids=["no-folder", "not-given", "no-tokenizer", "no-settings", "text-width", "image-size", "not-smolvlm"],
)
def test_a_missing_or_mismatched_vlm_folder_is_one_line(tiny, tmp_path, breakage, message):
    vlm, ckpt = tiny
    given = breakage(vlm, tmp_path)
    with pytest.raises(CheckpointError) as e:
        read_vlm_dir(given, read_checkpoint(ckpt))
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_import_without_its_vlm_folder_writes_nothing(tiny, tmp_path):
    _, ckpt = tiny
    out = tmp_path / "release"
    with pytest.raises(CheckpointError, match="pass --vlm-dir DIR"):
        import_checkpoint(ckpt, out, ImportOptions(contract=OPTS), log=lambda _: None)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_checkpoint_of_another_vlm_is_refused(tiny, tmp_path):
    """A VLM folder of other dimensions (the tiny one's vision tower at 512x512) against the checkpoint."""
    from dataclasses import replace

    vlm, ckpt = tiny
    other = make_vlm_folder(tmp_path / "other", replace(TINY_VLM, text_hidden=64, text_heads=2, text_kv_heads=1))
    with pytest.raises(CheckpointError, match="text_config.hidden_size is 64, the checkpoint's weights have 128"):
        read_vlm_dir(other, read_checkpoint(ckpt))


@pytest.mark.slow  # an import (three ONNX exports of the VLM and its expert) and a daemon: minutes on 2 cores
def test_import_sign_gate_serve_smolvla(tiny, tmp_path, keys):
    """The tiny SmolVLA imported (tokens, preprocessing, eager, .pt2 and ONNX against LeRobot;
    real-time chunking), signed, through the contract and equivalence gates, and served by a
    real vlad serve with an instruction: every chunk what the release computes in process."""
    from vlad.release.signing import verify_release
    from vlad_tools.gates.runner import run_gates

    vlm, ckpt = tiny
    private, trusted = keys
    out = tmp_path / "release"
    opts = ImportOptions(
        contract=ContractOptions(**{**vars(OPTS), **LOADED_CI}),
        windows=2,
        key=private,
        keys_dir=trusted,
        vlm_dir=vlm,
    )
    report = import_checkpoint(ckpt, out, opts, log=lambda _: None)
    assert report["passed"] and report["lineage"]["policy_type"] == "smolvla"
    for name in ("pytorch (eager)", "torch (policy.pt2)", "onnxruntime (policy.onnx)"):
        assert report["checks"][name]["output"]["max_abs"] < 1e-4, (name, report["checks"][name])
    assert report["checks"]["preprocessing"]["max_abs"] <= 1e-6
    assert report["checks"]["rtc"]["weight_1_max_abs"] < 1e-5 and report["checks"]["rtc"]["free_changed_max_abs"] > 0
    assert verify_release(out, trusted).id == "smolvla-t-1.0.0"
    assert (out / "tokenizer.json").is_file()
    gates = run_gates(
        out,
        out,
        tmp_path / "gates",
        gates=["contract", "equivalence"],
        keys_dir=str(trusted),
        progress=lambda _: None,
        html=False,
    )
    assert gates["passed"], [g["reasons"] for g in gates["gates"]]
    task = "pick up the red cube and put it in the box"
    assert _serve_and_compare(out, trusted, _frames(out, 3), task)[0] == 3
    # At a VLA's latency (150 ms, 5 periods at 30 fps) the daemon's real-time chunking inpaints
    # each chunk's start onto the pose the robot holds, as the release does in process.
    compared, guided = _serve_and_compare(out, trusted, _frames(out, 3), task, latency_ms=150.0)
    assert compared == 3 and guided >= 2, guided
    # Imported for the torch backend, the same at 150 ms by guidance (the flow head's programs).
    opts = dataclasses.replace(opts, backend="torch")
    torch_release = tmp_path / "release-torch"
    assert import_checkpoint(ckpt, torch_release, opts, log=lambda _: None)["passed"]
    compared, guided = _serve_and_compare(torch_release, trusted, _frames(torch_release, 3), task, latency_ms=150.0)
    assert compared == 3 and guided >= 2, guided


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    from vlad.release.signing import generate_keypair

    d = tmp_path_factory.mktemp("keys")
    _, private, _ = generate_keypair(d / "trusted", "smolvla-test")
    return private, d / "trusted"
