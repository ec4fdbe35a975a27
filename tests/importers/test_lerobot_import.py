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

from vlad.importers.lerobot.runtime import lerobot_version

if lerobot_version() is None:
    pytest.skip("LeRobot is not installed: scripts/bootstrap dev (or lerobot) installs it", allow_module_level=True)

from tests.importers.checkpoints import ACTION_DIM, STATE_DIM, make_checkpoint  # noqa: E402
from vlad.importers.lerobot.checkpoint import read_checkpoint  # noqa: E402
from vlad.importers.lerobot.contract import ContractOptions, build_contract, contract_data  # noqa: E402
from vlad.importers.lerobot.fixtures import synthetic_windows  # noqa: E402
from vlad.importers.lerobot.importer import ImportOptions, _noise, _vlad_window, import_checkpoint  # noqa: E402
from vlad.importers.lerobot.policies import export_module, lerobot_reference, load_policy  # noqa: E402
from vlad.processing import decode_actions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OPTS = ContractOptions(release_id="t", fps=50, state_units=("rad",), action_units=("rad",))
CASES = {
    "act": ("act", {}),
    "act-minmax": ("act", {"normalization_mapping": {"VISUAL": "MEAN_STD", "STATE": "MIN_MAX", "ACTION": "MIN_MAX"}}),
    "diffusion-ddim": ("diffusion", {}),
    "diffusion-ddpm": ("diffusion", {"noise_scheduler_type": "DDPM", "num_inference_steps": 3}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def loaded(request, tmp_path_factory):
    kind, overrides = CASES[request.param]
    path = make_checkpoint(tmp_path_factory.mktemp(request.param), kind, **overrides)
    ckpt = read_checkpoint(path)
    contract = build_contract(contract_data(ckpt, None, OPTS))
    policy, pre, post = load_policy(ckpt)
    module = export_module(policy, ckpt, [t.name for t in contract.inputs])
    return ckpt, contract, policy, pre, post, module


def test_the_export_module_computes_what_lerobot_computes(loaded):
    """vlad's preprocessing (the serving Preprocessor, with its history window) and the export
    module reproduce LeRobot's preprocessor -> predict_action_chunk -> postprocessor."""
    import torch

    ckpt, contract, policy, pre, post, module = loaded
    names = {"overhead": "overhead"}
    for k, window in enumerate(synthetic_windows(ckpt, 3, seed=7)):
        noise = _noise(ckpt, contract, 100 + k)
        ref = lerobot_reference(policy, pre, post, ckpt, window, noise, seed=100 + k)
        inputs = _vlad_window(contract, window, names, 100 + k)
        if noise is not None:
            inputs["noise"] = noise
        newest = (lambda a: a[:, -1]) if ckpt.n_obs_steps > 1 else (lambda a: a)
        np.testing.assert_allclose(
            newest(inputs["image_overhead"]), ref.inputs["observation.images.overhead"], atol=1e-6
        )
        np.testing.assert_allclose(newest(inputs["state"]), ref.inputs["observation.state"], atol=2e-6)
        with torch.inference_mode():
            out = module(*(torch.from_numpy(inputs[t.name]) for t in contract.inputs)).numpy()
        assert out.shape == ref.output.shape == (1, contract.action.chunk_length, ACTION_DIM)
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


def test_torchvision_operators_are_declared_not_faked():
    """torchvision imports beside the CPU torch; its compiled operators still fail loudly."""
    import torch
    import torchvision

    from vlad.importers.lerobot.runtime import prepare_torchvision

    prepare_torchvision()  # idempotent
    assert torchvision.models.resnet18 is not None
    with pytest.raises((RuntimeError, NotImplementedError)):
        torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)


# -- end to end: dataset -> lerobot-train -> import -> signed -> vlad serve -----------------------


def _serve_and_compare(release: Path, keys: Path, frames: list[tuple[np.ndarray, np.ndarray]]):
    """Publish ``frames`` to a real ``vlad serve`` on ``release``; each chunk must equal what
    the release computes in process on the same window (the one Preprocessor, ONNX Runtime)."""
    from vlad.contract import load_contract
    from vlad.gates.launcher import serve
    from vlad.gates.subject import open_subject
    from vlad.plugins import get_backend
    from vlad.processing import Preprocessor, RawObservation

    contract = load_contract(release / "contract.toml")
    session = get_backend("onnxruntime").load(release / "policy.onnx", contract, {"intra_op_threads": 1})
    pre = Preprocessor(contract, None)
    camera = contract.cameras[0].name
    period = int(contract.timing.control_period_ms * 1e6)
    compared = 0
    with serve(open_subject(release), warmup=2, keys_dir=str(keys)) as daemon:
        daemon.wait_ready()
        with daemon.client("import-test") as ctl:
            tick = time.monotonic_ns()

            def send(image, state):
                """One observation per control period (sensor time: now), into the daemon and
                the local window alike."""
                nonlocal tick
                tick += period
                while time.monotonic_ns() < tick:
                    time.sleep(0.001)  # paced to the control period
                t = time.monotonic_ns()
                tick = max(tick, t)
                seq = ctl.publish_observation({camera: image}, state, None, t_sensor_ns=t)
                ctl.heartbeat()
                inputs = pre.fill(RawObservation({camera: image}, state, "", seq, t))
                return seq, decode_actions(contract, session.infer(inputs)).copy()

            # The first frame until a policy chunk comes back: the action subscription has
            # joined and the daemon trusts the joint state (it holds until then).
            chunk = None
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (chunk is None or chunk.is_hold):
                send(*frames[0])
                chunk = ctl.recv_chunk(50)
            assert chunk is not None and not chunk.is_hold, (chunk, daemon.log_tail(10))
            for image, state in frames:
                seq, want = send(image, state)
                # the policy's chunk for this observation (the daemon may bridge with a hold first)
                chunk = None
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and (chunk is None or chunk.obs_seq < seq or chunk.is_hold):
                    chunk = ctl.recv_chunk(500) or chunk
                assert chunk is not None and chunk.obs_seq == seq and not chunk.is_hold, (chunk, daemon.log_tail(10))
                assert chunk.interventions == (), chunk.interventions
                np.testing.assert_allclose(chunk.actions, want, atol=1e-5)
                compared += 1
    session.close()
    return compared


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
        [env_py, "-m", "vlad.importers.lerobot.dataset", str(ds), "--episodes", "2"],
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
            "vlad.importers.lerobot.train",
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
    rng = np.random.default_rng(1)
    frames = [
        (rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), rng.uniform(-1, 1, STATE_DIM).astype(np.float32))
        for _ in range(3)
    ]
    assert _serve_and_compare(out, trusted, frames) == 3


@pytest.mark.slow  # a closed-loop episode: 8 s on the 2-core dev machine
def test_a_checkpoint_runs_in_closed_loop_through_lerobots_own_predict_path(tmp_path):
    """``demo --checkpoint``: the simulator driven by LeRobot's inference, every request answered."""
    from vlad.importers.lerobot.demo import lerobot_in_process

    summary = lerobot_in_process(make_checkpoint(tmp_path / "act"), 1, 10_000, 4, progress=lambda *a: None)
    row = summary["per_instruction"]["reach the red target"]
    assert row["episodes"] == 1 and np.isfinite(row["mean_final_distance_m"])
    assert summary["held_periods"] == 0 and summary["late_answers"] == 0
    with pytest.raises(SystemExit, match="ACT checkpoints only"):
        lerobot_in_process(make_checkpoint(tmp_path / "diffusion", "diffusion"), 1, 10_000, 4)
