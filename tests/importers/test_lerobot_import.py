"""The LeRobot importer against LeRobot itself: random-weight ACT and Diffusion Policy
checkpoints (written by LeRobot), LeRobot's own inference as the reference, the exports run
by vlad's backends and served by a real ``vlad serve``.

Skipped, with the reason, where LeRobot is not installed (``scripts/bootstrap dev``
installs it: docs/lerobot.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from vlad_tools.importers.lerobot.runtime import lerobot_version

if lerobot_version() is None:
    pytest.skip("LeRobot is not installed: scripts/bootstrap dev (or lerobot) installs it", allow_module_level=True)

from vlad.processing import decode_actions  # noqa: E402
from vlad_tools.importers.lerobot.checkpoint import read_checkpoint  # noqa: E402
from vlad_tools.importers.lerobot.contract import ContractOptions, build_contract, contract_data  # noqa: E402
from vlad_tools.importers.lerobot.fixtures import synthetic_windows  # noqa: E402
from vlad_tools.importers.lerobot.importer import ImportOptions, Stat, _noise, _vlad_window, import_checkpoint  # noqa: E402
from vlad_tools.importers.lerobot.policies import export_module, lerobot_reference, load_policy  # noqa: E402
from vlad_tools.testing.lerobot import SO101, SO101_JOINTS, Robot, make_checkpoint, write_dataset_meta  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OPTS = ContractOptions(release_id="t", fps=50, state_units=("rad",), action_units=("rad",))
# Diffusion Policy needs every camera at one size (LeRobot 0.4.4's validate_features): the
# SO-101's two cameras at one size for it; ACT takes them at their own sizes.
SO101_SAME = Robot({"front": (48, 64), "wrist": (48, 64)}, SO101.state_range, SO101.action_range, SO101.names)
MIN_MAX = {"VISUAL": "MEAN_STD", "STATE": "MIN_MAX", "ACTION": "MIN_MAX"}
CASES = {
    "act": ("act", {}),
    "act-minmax": ("act", {"normalization_mapping": MIN_MAX}),
    "diffusion-ddim": ("diffusion", {}),
    "diffusion-ddpm": ("diffusion", {"noise_scheduler_type": "DDPM", "num_inference_steps": 3}),
    # SO-101-like: two cameras, 6-D state and action in degrees
    "act-so101": ("act", {"robot": SO101, "use_vae": True, "chunk_size": 50, "n_action_steps": 50}),
    "diffusion-so101": ("diffusion", {"robot": SO101_SAME, "crop_shape": (40, 56)}),
}


def _opts(ckpt) -> ContractOptions:
    unit = "deg" if ckpt.state.shape[0] == len(SO101_JOINTS) else "rad"
    return ContractOptions(**{**vars(OPTS), "state_units": (unit,), "action_units": (unit,)})


@pytest.fixture(scope="module", params=sorted(CASES))
def loaded(request, tmp_path_factory):
    kind, overrides = CASES[request.param]
    path = make_checkpoint(tmp_path_factory.mktemp(request.param), kind, **overrides)
    ckpt = read_checkpoint(path)
    contract = build_contract(contract_data(ckpt, None, _opts(ckpt)))
    policy, pre, post = load_policy(ckpt)
    module = export_module(policy, ckpt, [t.name for t in contract.inputs])
    return ckpt, contract, policy, pre, post, module


def _camera_names(ckpt) -> dict[str, str]:
    """LeRobot camera name -> the robot's (the same: no --camera given)."""
    return {c.key.removeprefix("observation.images."): c.key.removeprefix("observation.images.") for c in ckpt.cameras}


def test_the_export_module_computes_what_lerobot_computes(loaded):
    """vlad's preprocessing (the serving Preprocessor, with its history window) and the export
    module reproduce LeRobot's preprocessor -> predict_action_chunk -> postprocessor."""
    import torch

    ckpt, contract, policy, pre, post, module = loaded
    names = _camera_names(ckpt)
    for k, window in enumerate(synthetic_windows(ckpt, 3, seed=7)):
        noise = _noise(ckpt, contract, 100 + k)
        ref = lerobot_reference(policy, pre, post, ckpt, window, noise, seed=100 + k)
        inputs = _vlad_window(contract, window, names, 100 + k)
        if noise is not None:
            inputs["noise"] = noise
        newest = (lambda a: a[:, -1]) if ckpt.n_obs_steps > 1 else (lambda a: a)
        for camera in names:
            np.testing.assert_allclose(
                newest(inputs[f"image_{camera}"]), ref.inputs[f"observation.images.{camera}"], atol=1e-6
            )
        np.testing.assert_allclose(newest(inputs["state"]), ref.inputs["observation.state"], atol=2e-6)
        with torch.inference_mode():
            out = module(*(torch.from_numpy(inputs[t.name]) for t in contract.inputs)).numpy()
        assert out.shape == ref.output.shape == (1, contract.action.chunk_length, ckpt.action.shape[0])
        np.testing.assert_allclose(out, ref.output, atol=5e-5)
        actions = decode_actions(contract, {"actions": out})
        np.testing.assert_allclose(actions, ref.actions, atol=5e-5 * max(j.std for j in contract.action.joints) + 1e-6)
        # not vacuous: another window gives another chunk
        assert np.abs(ref.output).max() > 1e-3


def test_a_window_of_distinct_frames_matters(loaded):
    """With history, LeRobot's chunk depends on the older frame: vlad must feed it."""
    ckpt, contract, policy, pre, post, _ = loaded
    if ckpt.n_obs_steps == 1:
        pytest.skip("no observation history")
    window = synthetic_windows(ckpt, 1, seed=3)[0]
    noise = _noise(ckpt, contract, 5)
    full = lerobot_reference(policy, pre, post, ckpt, window, noise, seed=5)
    restarted = lerobot_reference(policy, pre, post, ckpt, window[-1:], noise, seed=5)
    assert np.abs(full.output - restarted.output).max() > 1e-4


def test_a_state_entry_held_constant_is_preprocessed_as_lerobot_does(tmp_path):
    """MIN_MAX with min = max (a gripper held still in the data): LeRobot maps the constant to
    -1; vlad's serving Preprocessor must too, and the synthetic check windows put the entry at
    that constant, so the import's checks compare it."""
    still = SO101.state_range[:5] + ((10.0, 10.0),)
    robot = Robot(SO101.cameras, still, SO101.action_range, SO101.names)
    ckpt = read_checkpoint(make_checkpoint(tmp_path / "c", "act", robot=robot, normalization_mapping=MIN_MAX))
    contract = build_contract(contract_data(ckpt, None, _opts(ckpt)))
    policy, pre, post = load_policy(ckpt)
    windows = synthetic_windows(ckpt, 2)
    assert all(w[-1].state[5] == np.float32(10.0) for w in windows)
    for k, window in enumerate(windows):
        ref = lerobot_reference(policy, pre, post, ckpt, window, None)
        inputs = _vlad_window(contract, window, _camera_names(ckpt), k)
        assert ref.inputs["observation.state"][0, 5] == -1.0
        np.testing.assert_allclose(inputs["state"], ref.inputs["observation.state"], atol=1e-6)


def test_nan_is_no_agreement():
    """A NaN output (a diverged checkpoint, on either side) is an infinite error, not none."""
    stat = Stat()
    stat.add(np.zeros(3), np.array([0.0, np.nan, 0.0]))
    stat.add(np.zeros(3), np.zeros(3))
    assert stat.max_abs == np.inf


@pytest.fixture(scope="module")
def act_checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("act-ckpt"), "act")


def _weights(path: Path, change) -> None:
    """Rewrite ``path``/model.safetensors with ``change`` applied to its tensors (a dict)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def _nan(t):
    t["model.action_head.weight"][0, 0] = float("nan")


def _missing(t):
    del t["model.action_head.weight"]


def _unexpected(t):
    import torch

    t["model.extra_head.weight"] = torch.zeros(2, 2)


def _reshaped(t):
    import torch

    t["model.action_head.bias"] = torch.zeros(t["model.action_head.bias"].shape[0] + 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda p: _weights(p, _nan),
            "model.safetensors: 1 tensor(s) hold NaN or Inf (model.action_head.weight): the training diverged; "
            "import an earlier checkpoint",
        ),
        (
            lambda p: _weights(p, _missing),
            "model.safetensors: lacks 1 tensor(s) the policy config.json describes has (model.action_head.weight)",
        ),
        (
            lambda p: _weights(p, _unexpected),
            "model.safetensors: holds 1 tensor(s) the policy config.json describes does not have "
            "(model.extra_head.weight)",
        ),
        (
            lambda p: _weights(p, _reshaped),
            "model.safetensors: tensor model.action_head.bias has shape [3], the policy config.json describes needs [2]",
        ),
        (
            lambda p: (p / "model.safetensors").write_bytes((p / "model.safetensors").read_bytes()[:-1000]),
            "model.safetensors: not a complete safetensors file",
        ),
        (
            lambda p: _config(p, temporal_ensemble_coeff=0.01, n_action_steps=1),
            "config.json: ACT temporal ensembling (temporal_ensemble_coeff 0.01) is not supported",
        ),
        (
            lambda p: _config(p, dim_model=65),
            "config.json: LeRobot cannot build the policy: embed_dim must be divisible by num_heads",
        ),
    ],
    ids=[
        "nan-weights",
        "missing-tensor",
        "unexpected-tensor",
        "other-shape",
        "truncated",
        "temporal-ensembling",
        "bad",
    ],
)
def test_a_broken_checkpoint_is_refused_in_one_line_and_nothing_is_written(
    act_checkpoint, tmp_path, capfd, change, message
):
    """Through the command line: exit 2, one line on stderr naming what is wrong, no --out
    folder (nor a staging folder beside it), and an old release under --force left as it was."""
    import shutil

    from vlad.cli import vladctl_main

    ckpt = tmp_path / "ckpt"
    shutil.copytree(act_checkpoint, ckpt)
    change(ckpt)
    base = ["import", "lerobot", str(ckpt), "--fps", "30", "--state-units", "rad", "--action-units", "rad"]
    releases = tmp_path / "releases"
    releases.mkdir()
    capfd.readouterr()
    assert vladctl_main([*base, "--out", str(releases / "new")]) == 2
    err = capfd.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert list(releases.iterdir()) == []
    old = releases / "old"
    old.mkdir()
    (old / "manifest.toml").write_text("the release that was here")
    assert vladctl_main([*base, "--out", str(old), "--force"]) == 2
    assert [p.name for p in releases.iterdir()] == ["old"] and [p.name for p in old.iterdir()] == ["manifest.toml"]


def test_a_backbone_trained_from_imagenet_weights_loads_offline(act_checkpoint, tmp_path):
    """ACT's default config names torchvision's ImageNet weights for the backbone; every backbone
    weight is in model.safetensors, so loading must neither download them nor need them."""
    import shutil

    import torch
    from safetensors.torch import load_file

    ckpt = tmp_path / "ckpt"
    shutil.copytree(act_checkpoint, ckpt)
    _config(ckpt, pretrained_backbone_weights="ResNet18_Weights.IMAGENET1K_V1")
    policy, _, _ = load_policy(read_checkpoint(ckpt))
    saved = load_file(str(ckpt / "model.safetensors"))
    state = policy.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items())


def test_large_weights_go_to_onnx_external_data_signed_and_run(act_checkpoint, tmp_path, keys):
    """Weights above ``external_data_above`` (here 0 bytes, so a tiny ACT counts as large; a
    SmolVLA at full size is ~1.8 GB) go to ``policy.onnx.data``: the graph file holds none of
    them, the manifest lists the data file as signed weights (a changed byte fails the
    verification), and vlad's ONNX Runtime backend runs the release within the budget of LeRobot."""
    import onnx

    from vlad.release.manifest import load_manifest
    from vlad.release.signing import IntegrityError, verify_release

    private, trusted = keys
    out = tmp_path / "release"
    opts = ImportOptions(contract=OPTS, windows=1, key=private, keys_dir=trusted, external_data_above=0)
    report = import_checkpoint(act_checkpoint, out, opts, log=lambda _: None)
    assert report["checks"]["onnxruntime (policy.onnx)"]["output"]["max_abs"] < 1e-4
    assert [e["name"] for e in report["export"]] == ["actions", "prefix"]  # the fixed and intermediate exports too

    graph = onnx.load(str(out / "policy.onnx"), load_external_data=False)
    inline = [t.name for t in graph.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL and t.raw_data]
    external = {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"}
    assert external == {"policy.onnx.data"}
    weights = sum(t.numel() * t.element_size() for t in load_policy(read_checkpoint(act_checkpoint))[0].parameters())
    data = out / "policy.onnx.data"
    assert data.stat().st_size >= 0.9 * weights > (out / "policy.onnx").stat().st_size, inline

    entry = {a.path: a for a in load_manifest(out / "manifest.toml").artifacts}["policy.onnx.data"]
    assert (entry.role, entry.size) == ("weights", data.stat().st_size)
    verify_release(out, trusted)
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    data.write_bytes(bytes(blob))
    with pytest.raises(IntegrityError, match="policy.onnx.data"):
        verify_release(out, trusted)


def _config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_torchvision_operators_are_declared_not_faked():
    """torchvision imports beside the CPU torch; its compiled operators still fail loudly."""
    import torch
    import torchvision

    from vlad_tools.importers.lerobot.runtime import prepare_torchvision

    prepare_torchvision()  # idempotent
    assert torchvision.models.resnet18 is not None
    with pytest.raises((RuntimeError, NotImplementedError)):
        torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)


# -- end to end: dataset -> lerobot-train -> import -> signed -> vlad serve -----------------------


def _serve_and_compare(
    release: Path,
    keys: Path,
    frames: list[tuple[dict[str, np.ndarray], np.ndarray]],
    instruction: str | None = None,
    latency_ms: float = 0.0,
) -> tuple[int, int]:
    """Publish ``frames`` (images by the robot's camera names, the state; ``instruction`` with
    each, for a release that reads one) to a real ``vlad serve`` on ``release``; each chunk
    must equal what the release computes in process on the same window (the one
    Preprocessor and the release's tokenizer, the release's backend). The controller reports no
    executed chunk (``exec`` nil). Where the daemon's real-time chunking continues something (a
    release with ``[rtc]`` answering a period or more after the observation), the chunk in
    process gets the same guide: what the daemon's guard takes the robot to execute, derived
    by the same guard class from the chunks the controller received before.
    ``latency_ms``: each inference takes that long (the ``wrapped`` backend). Returns the
    chunks compared and how many of them the daemon computed with a guide."""
    from vlad.contract import load_contract
    from vlad.plugins import get_backend
    from vlad.processing import Guide, Preprocessor, RawObservation, Tokenizer
    from vlad.serving.guard import ActionGuard
    from vlad.serving.rtc import soft_mask
    from vlad_tools.gates.launcher import serve
    from vlad_tools.gates.subject import open_subject

    contract = load_contract(release / "contract.toml")
    subject = open_subject(release)
    serving = subject.serving  # the engine the daemon runs: the same one in process
    session = get_backend(serving.backend).load(release / serving.artifact, contract, serving.options)
    pre = Preprocessor(contract, Tokenizer.from_contract(contract) if contract.language else None)
    period = int(contract.timing.control_period_ms * 1e6)
    n = contract.action.chunk_length
    compared = guided = 0
    with serve(subject, warmup=2, keys_dir=str(keys), latency_ms=latency_ms) as daemon:
        daemon.wait_ready()
        with daemon.client("import-test") as ctl:
            # The daemon's view of what the robot executes, rebuilt by the same guard class from
            # the chunks received. The daemon stamps a chunk as sent once it has left: between its
            # header's t_issue and its arrival here, so one guard stamps each end.
            guards = (ActionGuard(contract), ActionGuard(contract))

            tick = time.monotonic_ns()

            def send(images, state) -> RawObservation:
                """One observation per control period (sensor time: now)."""
                nonlocal tick
                tick += period
                while time.monotonic_ns() < tick:
                    time.sleep(0.001)  # paced to the control period
                t = time.monotonic_ns()
                tick = max(tick, t)
                seq = ctl.publish_observation(images, state, instruction, t_sensor_ns=t, executing=None)
                ctl.heartbeat()
                for guard in guards:
                    assert guard.trusted.judge(state, t) is None
                return RawObservation(images, state, instruction or "", seq, t, client="import-test")

            def receive(chunk) -> None:
                if not chunk.advisory:
                    for guard, issued in zip(guards, (chunk.t_issue_ns, chunk.t_receive_ns), strict=True):
                        guard.record(
                            chunk.actions, chunk.t_sensor_ns, chunk.valid_until_ns, issued, chunk.client, chunk.seq
                        )

            def in_process(raw: RawObservation, rtc: tuple[int, int] | None) -> np.ndarray:
                """The release's chunk for ``raw``; with the daemon's ``rtc`` (continued chunk,
                delay) the guide the daemon used."""
                guide = None
                if rtc is not None:
                    seen = [g.executing(raw.client, raw.sensor_time_ns, None) for g in guards]
                    executing = next((e for e in seen if e.chunk == rtc[0]), None)
                    assert executing is not None, (rtc, [e.chunk for e in seen])
                    guide = Guide(executing.path[1:], soft_mask(n, rtc[1], max(rtc[1], executing.covered)))
                return decode_actions(contract, session.infer(pre.fill(raw, guide))).copy()

            # The first frame until a policy chunk comes back: the action subscription has
            # joined and the daemon trusts the joint state (it holds until then).
            chunk = None
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (chunk is None or chunk.is_hold):
                send(*frames[0])
                chunk = ctl.recv_chunk(50 + int(latency_ms))
                if chunk is not None:
                    receive(chunk)
            assert chunk is not None and not chunk.is_hold, (chunk, daemon.log_tail(10))
            for images, state in frames:
                raw = send(images, state)
                # the policy's chunk for this observation (the daemon may bridge with a hold first)
                chunk = None
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and (chunk is None or chunk.obs_seq < raw.sequence or chunk.is_hold):
                    got = ctl.recv_chunk(500)
                    if got is not None:
                        chunk = got
                        if got.obs_seq < raw.sequence or got.is_hold:
                            receive(got)  # before this observation's own chunk: part of what it continues
                assert chunk is not None and chunk.obs_seq == raw.sequence and not chunk.is_hold, (
                    chunk,
                    daemon.log_tail(10),
                )
                assert chunk.interventions == (), chunk.interventions
                # fp32 within a few ulps: a guided step's vector-Jacobian product sums in an order
                # that the engine's threads choose (torch backend, joints in degrees: 5e-5 of 90)
                np.testing.assert_allclose(chunk.actions, in_process(raw, chunk.rtc), rtol=1e-5, atol=1e-5)
                receive(chunk)
                compared += 1
                guided += chunk.rtc is not None
    session.close()
    return compared, guided


# These tests compare the daemon's chunks with the release computed in process, so nothing
# else may change them: a shared 2-core CI machine misses a 20 ms deadline often enough for
# the health monitors to fall back to the hold posture, and a barely trained policy points
# anywhere, where the guard's bounds and rate limits (tested in tests/serving) would clip.
LOADED_CI = {"deadline_ms": 250.0, "max_age_periods": 10.0, "bounds_margin": 100.0, "rate_limit_factor": 1e4}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    from vlad.release.signing import generate_keypair

    d = tmp_path_factory.mktemp("keys")
    _, private, _ = generate_keypair(d / "trusted", "import-test")
    return private, d / "trusted"


@pytest.mark.slow
def test_train_import_sign_act(tmp_path, keys):
    """A LeRobotDataset from the simulated expert, 2 steps of lerobot-train, the import
    (dataset meta and joint names found through train_config.json, recorded check windows),
    a signed release. Serving an import through the daemon: the Diffusion test below."""
    from vlad.release.signing import verify_release

    env_py = sys.executable
    ds = tmp_path / "dataset"
    run = subprocess.run(
        [env_py, "-m", "vlad_tools.importers.lerobot.dataset", str(ds), "--episodes", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    info = json.loads((ds / "meta" / "info.json").read_text())
    assert info["fps"] == 50 and info["total_episodes"] == 2 and info["total_frames"] == 100
    train = tmp_path / "train"
    run = subprocess.run(
        [
            env_py,
            "-m",
            "vlad_tools.importers.lerobot.train",
            "--dataset.repo_id=local/t",
            f"--dataset.root={ds}",
            "--dataset.video_backend=pyav",
            "--policy.type=act",
            "--policy.device=cpu",
            "--policy.push_to_hub=false",
            "--policy.pretrained_backbone_weights=null",
            "--policy.dim_model=64",
            "--policy.dim_feedforward=128",
            "--policy.n_heads=4",
            "--policy.n_encoder_layers=1",
            "--policy.n_decoder_layers=1",
            "--policy.use_vae=false",
            "--policy.chunk_size=8",
            "--policy.n_action_steps=8",
            "--steps=2",
            "--batch_size=4",
            "--num_workers=0",
            "--seed=0",
            f"--output_dir={train}",
            "--save_freq=2",
            "--log_freq=1",
            "--eval_freq=0",
            "--wandb.enable=false",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    private, trusted = keys
    out = tmp_path / "release"
    opts = ImportOptions(
        contract=ContractOptions(
            release_id="act-test", state_units=("rad", "rad", "rad/s", "rad/s"), action_units=("rad",), **LOADED_CI
        ),
        windows=2,
        key=private,
        keys_dir=trusted,
    )
    report = import_checkpoint(train / "checkpoints" / "last", out, opts, log=lambda _: None)
    assert report["passed"] and report["lineage"]["policy_type"] == "act"
    assert (
        report["lineage"]["lerobot_version"] == lerobot_version() and len(report["lineage"]["checkpoint_sha256"]) == 64
    )
    assert report["windows"]["source"].startswith("recorded")
    for name in ("torch (policy.pt2)", "onnxruntime (policy.onnx)"):
        assert report["checks"][name]["output"]["max_abs"] < 1e-4
    assert verify_release(out, trusted).id == "act-test-1.0.0"
    from vlad.contract import load_contract

    c = load_contract(out / "contract.toml")
    assert c.proprio.names[0] == "joint0.position" and c.action.joints[0].name == "joint0"
    assert c.timing.control_period_ms == 20.0


@pytest.mark.slow
def test_import_sign_serve_diffusion_with_history(tmp_path, keys):
    """A random Diffusion Policy (2 observation frames, DDIM): imported, signed, served by a
    real vlad serve whose Preprocessor keeps the window: every chunk equals the release
    computed in process on the same frames and noise."""
    private, trusted = keys
    ckpt = make_checkpoint(tmp_path / "ckpt", "diffusion")
    out = tmp_path / "release"
    opts = ImportOptions(
        contract=ContractOptions(**{**vars(OPTS), "release_id": "diffusion-test", "fps": 10, **LOADED_CI}),
        windows=2,
        key=private,
        keys_dir=trusted,
    )
    report = import_checkpoint(ckpt, out, opts, log=lambda _: None)
    assert report["passed"] and report["windows"]["frames"] == 2
    assert _serve_and_compare(out, trusted, _frames(out, 3)) == (3, 0)


SO101_UNITS = ("deg",) * 5 + ("1",)  # the gripper: 0..100, dimensionless


@pytest.mark.slow  # an import (three ONNX exports), the gates and a daemon: ~1 min each on the 2-core dev machine
@pytest.mark.parametrize(
    ("kind", "overrides"),
    [
        ("act", {"robot": SO101, "use_vae": True, "chunk_size": 50, "n_action_steps": 50}),
        ("diffusion", {"robot": SO101_SAME, "crop_shape": (40, 56)}),
    ],
    ids=["act", "diffusion"],
)
def test_so101_like_import_verify_gate_serve(tmp_path, keys, kind, overrides):
    """SO-101-shaped checkpoints (two cameras, ACT's of different sizes; 6-D state and action in
    degrees) built by LeRobot: imported (the id from the run's folder, signed), verified, through
    the contract and equivalence gates, and served by a real vlad serve, chunk for chunk what the
    release computes in process. ACT with the dataset's joint names, Diffusion without (warned)."""
    from vlad.contract import load_contract
    from vlad.release.signing import verify_release
    from vlad_tools.gates.runner import run_gates

    private, trusted = keys
    run = tmp_path / "outputs" / "train" / f"so101_{kind}"
    ckpt = make_checkpoint(run / "checkpoints" / "000100" / "pretrained_model", kind, **overrides)
    meta = write_dataset_meta(tmp_path / "dataset" / "meta", SO101) if kind == "act" else None
    out = tmp_path / "release"
    opts = ImportOptions(
        contract=ContractOptions(release_id="", fps=30, state_units=SO101_UNITS, action_units=SO101_UNITS, **LOADED_CI),
        dataset_meta=meta,
        windows=2,
        key=private,
        keys_dir=trusted,
    )
    report = import_checkpoint(ckpt, out, opts, log=lambda _: None)
    assert report["passed"] and [e["name"] for e in report["export"]] == ["actions", "prefix"]
    for name in ("torch (policy.pt2)", "onnxruntime (policy.onnx)"):
        assert report["checks"][name]["output"]["max_abs"] < 1e-4
    assert verify_release(out, trusted).id == f"lerobot-so101_{kind}-1.0.0"
    assert not (out / "policy.onnx.data").exists()  # a small model's weights stay in policy.onnx
    contract = load_contract(out / "contract.toml")
    assert [(c.name, c.raw.height, c.raw.width) for c in contract.cameras] == [
        (name, h, w) for name, (h, w) in overrides["robot"].cameras.items()
    ]
    if kind == "act":
        assert report["warnings"] == [] and contract.action.joints[5].name == "gripper"
    else:
        assert [w.split(" entries")[0] for w in report["warnings"]] == ["observation.state", "action"]
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
    assert _serve_and_compare(out, trusted, _frames(out, 3)) == (3, 0)


def _frames(release: Path, n: int, seed: int = 1) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """``n`` random robot frames for ``release``'s contract: every camera at its size, a state
    inside the proprio normalization's range."""
    from vlad.contract import load_contract

    contract = load_contract(release / "contract.toml")
    rng = np.random.default_rng(seed)
    p = contract.proprio
    mean, std = np.asarray(p.mean, np.float32), np.asarray(p.std, np.float32)
    return [
        (
            {c.name: rng.integers(0, 256, (c.raw.height, c.raw.width, 3), dtype=np.uint8) for c in contract.cameras},
            (mean + std * rng.uniform(-1, 1, p.dim)).astype(np.float32),
        )
        for _ in range(n)
    ]


@pytest.mark.slow  # a closed-loop episode: 8 s on the 2-core dev machine
def test_a_checkpoint_runs_in_closed_loop_through_lerobots_own_predict_path(tmp_path):
    """``demo --checkpoint``: the simulator driven by LeRobot's inference, every request answered."""
    from vlad_tools.importers.lerobot.demo import lerobot_in_process

    summary = lerobot_in_process(make_checkpoint(tmp_path / "act"), 1, 10_000, 4, progress=lambda *a: None)
    row = summary["per_instruction"]["reach the red target"]
    assert row["episodes"] == 1 and np.isfinite(row["mean_final_distance_m"])
    assert summary["held_periods"] == 0 and summary["late_answers"] == 0
    with pytest.raises(SystemExit, match="ACT checkpoints only"):
        lerobot_in_process(make_checkpoint(tmp_path / "diffusion", "diffusion"), 1, 10_000, 4)
