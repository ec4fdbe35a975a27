"""Reading LeRobot checkpoints and writing their contracts, without running a policy.

The checkpoints are the files LeRobot writes (config.json, processor JSONs, statistics in
safetensors), made here file by file so that every missing or broken piece can be tested:
each one must be a one-line error naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("safetensors", reason="the lerobot extra is not installed (scripts/bootstrap dev installs it)")

from safetensors.numpy import save_file  # noqa: E402

from vlad.cli import vladctl_main  # noqa: E402
from vlad_tools.importers.lerobot.checkpoint import CheckpointError, read_checkpoint, read_dataset_meta  # noqa: E402
from vlad_tools.importers.lerobot.contract import (  # noqa: E402
    ContractOptions,
    affine,
    build_contract,
    contract_data,
    contract_toml,
)

STATE_NAMES = ["joint0.pos", "joint1.pos", "joint0.vel", "joint1.vel"]


def write_checkpoint(
    root: Path, ptype: str = "act", norm: dict | None = None, drop: str | None = None, edit=None, **config
) -> Path:
    """A checkpoint folder as ``save_pretrained`` writes it (weights are a placeholder file);
    ``edit`` changes the statistics (``name.stat`` -> values) before they are written."""
    norm = norm or {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    root.mkdir(parents=True, exist_ok=True)
    cfg = {
        "type": ptype,
        "n_obs_steps": 1,
        "input_features": {
            "observation.images.top": {"type": "VISUAL", "shape": [3, 32, 48]},
            "observation.state": {"type": "STATE", "shape": [4]},
        },
        "output_features": {"action": {"type": "ACTION", "shape": [2]}},
        "normalization_mapping": norm,
        "chunk_size": 10,
        "n_action_steps": 5,
        **config,
    }
    (root / "config.json").write_text(json.dumps(cfg))
    save_file({"model.weight": np.zeros((2, 3), np.float32)}, str(root / "model.safetensors"))  # a placeholder
    rng = np.random.default_rng(0)
    flat = {}
    for key, shape in (("observation.images.top", (3, 1, 1)), ("observation.state", (4,)), ("action", (2,))):
        lo = rng.uniform(-2, -1, shape).astype(np.float32)
        hi = rng.uniform(1, 2, shape).astype(np.float32)
        flat.update(
            {
                f"{key}.mean": ((lo + hi) / 2).astype(np.float32),
                f"{key}.std": rng.uniform(0.1, 0.5, shape).astype(np.float32),
                f"{key}.min": lo,
                f"{key}.max": hi,
            }
        )
    flat = {k: v for k, v in flat.items() if k != drop}
    if edit is not None:
        edit(flat)
    for pipeline, registry, step in (
        ("policy_preprocessor", "normalizer_processor", 3),
        ("policy_postprocessor", "unnormalizer_processor", 0),
    ):
        state_file = f"{pipeline}_step_{step}_{registry}.safetensors"
        save_file(flat, str(root / state_file))
        doc = {
            "name": pipeline,
            "steps": [{"registry_name": registry, "config": {"eps": 1e-8}, "state_file": state_file}],
        }
        (root / f"{pipeline}.json").write_text(json.dumps(doc))
    return root


def write_info(path: Path, fps: float = 30) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    info = {
        "fps": fps,
        "robot_type": "so100",
        "features": {
            "observation.state": {"dtype": "float32", "shape": [4], "names": STATE_NAMES},
            "action": {"dtype": "float32", "shape": [2], "names": ["joint0.pos", "joint1.pos"]},
            "observation.images.top": {
                "dtype": "video",
                "shape": [32, 48, 3],
                "names": ["height", "width", "channels"],
            },
        },
    }
    (path / "info.json").write_text(json.dumps(info))
    return path / "info.json"


OPTS = ContractOptions(release_id="t", state_units=("rad", "rad", "rad/s", "rad/s"), action_units=("rad",))


def test_checkpoint_is_read_with_its_statistics(tmp_path):
    ckpt = read_checkpoint(write_checkpoint(tmp_path / "c"))
    assert ckpt.type == "act" and [c.key for c in ckpt.cameras] == ["observation.images.top"]
    assert ckpt.chunk_length == 10 and ckpt.n_action_steps == 5 and ckpt.n_obs_steps == 1
    assert ckpt.stats["observation.state"]["mean"].shape == (4,) and ckpt.eps == 1e-8
    assert len(ckpt.sha256) == 64 and "model.safetensors" in ckpt.files


def test_training_checkpoint_folder_is_accepted(tmp_path):
    write_checkpoint(tmp_path / "000100" / "pretrained_model")
    assert read_checkpoint(tmp_path / "000100").path.name == "pretrained_model"


def test_the_hash_follows_every_file(tmp_path):
    a = read_checkpoint(write_checkpoint(tmp_path / "c")).sha256
    save_file({"model.weight": np.ones((2, 3), np.float32)}, str(tmp_path / "c" / "model.safetensors"))
    assert read_checkpoint(tmp_path / "c").sha256 != a


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda p: (p / "config.json").unlink(), "no config.json"),
        (lambda p: (p / "config.json").write_text("{not json"), "not valid JSON"),
        (lambda p: (p / "model.safetensors").unlink(), "missing model.safetensors"),
        (
            lambda p: (p / "policy_preprocessor_step_3_normalizer_processor.safetensors").unlink(),
            "missing policy_preprocessor_step_3_normalizer_processor.safetensors",
        ),
        (
            lambda p: (p / "policy_preprocessor_step_3_normalizer_processor.safetensors").write_bytes(b"\x00" * 16),
            "not a safetensors file",
        ),
        (lambda p: (p / "policy_postprocessor.json").write_text('{"steps": []}'), "no unnormalizer_processor step"),
        (
            lambda p: (p / "model.safetensors").write_bytes((p / "model.safetensors").read_bytes()[:-5]),
            "model.safetensors: not a complete safetensors file (Error while deserializing header: incomplete",
        ),
        (lambda p: (p / "model.safetensors").write_bytes(b"weights"), "model.safetensors: not a complete"),
    ],
    ids=["no-config", "bad-json", "no-weights", "no-stats", "bad-stats", "no-unnormalizer", "truncated", "not-weights"],
)
def test_a_missing_piece_is_one_line_naming_it(tmp_path, breakage, message):
    root = write_checkpoint(tmp_path / "c")
    breakage(root)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(root)
    assert message in str(e.value) and "\n" not in str(e.value)


SMOLVLA = {"num_steps": 10, "tokenizer_max_length": 48, "max_state_dim": 32, "max_action_dim": 32}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ptype": "pi0"}, "policy type 'pi0' is not supported (does not build offline here"),
        (
            {"ptype": "smolvla", **SMOLVLA, "empty_cameras": 1},
            "SmolVLA with empty_cameras = 1 is not supported: a vlad contract has no camera a robot does not send",
        ),
        (
            {"ptype": "smolvla", **SMOLVLA, "max_action_dim": 1},
            "action has 2 entries, more than max_action_dim (1): LeRobot pads it to that length",
        ),
        ({"ptype": "smolvla", **SMOLVLA, "num_steps": 0}, "num_steps must be an integer in [1, 1000], got 0"),
        ({"ptype": "something"}, "unknown to this importer"),
        (
            {"norm": {"STATE": "MIN_MAX"}, "drop": "observation.state.min"},
            "no 'observation.state.min' statistic (MIN_MAX",
        ),
        ({"norm": {"STATE": "SOMETHING"}}, "normalization mode(s) {'STATE': 'SOMETHING'} unknown"),
        (
            {"input_features": {"observation.environment_state": {"type": "ENV", "shape": [3]}}},
            "observation.environment_state'] are not supported",
        ),
        ({"input_features": {"observation.state": {"type": "STATE", "shape": [4]}}}, "has no camera input"),
        (
            {"temporal_ensemble_coeff": 0.01, "n_action_steps": 1},
            "ACT temporal ensembling (temporal_ensemble_coeff 0.01) is not supported",
        ),
        (
            {
                "ptype": "diffusion",
                "horizon": 16,
                "num_train_timesteps": 100,
                "n_action_steps": 8,
                "input_features": {
                    "observation.images.top": {"type": "VISUAL", "shape": [3, 32, 48]},
                    "observation.images.wrist": {"type": "VISUAL", "shape": [3, 24, 32]},
                    "observation.state": {"type": "STATE", "shape": [4]},
                },
            },
            "Diffusion Policy needs every camera at one size (LeRobot stacks them), this config has top 32x48, "
            "wrist 24x32",
        ),
    ],
    ids=[
        "pi0",
        "smolvla-empty-cameras",
        "smolvla-action-dim",
        "smolvla-steps",
        "unknown-type",
        "missing-stat",
        "bad-mode",
        "env-state",
        "no-camera",
        "temporal-ensembling",
        "diffusion-camera-sizes",
    ],
)
def test_what_cannot_be_imported_is_named(tmp_path, kwargs, message):
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(write_checkpoint(tmp_path / "c", **kwargs))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_nonfinite_statistics_are_refused(tmp_path):
    root = write_checkpoint(tmp_path / "c")
    stats = root / "policy_preprocessor_step_3_normalizer_processor.safetensors"
    from safetensors.numpy import load_file

    flat = load_file(str(stats))
    flat["observation.state.std"][1] = np.nan
    save_file(flat, str(stats))
    with pytest.raises(CheckpointError, match="observation.state.std' holds NaN"):
        read_checkpoint(root)


# -- the contract ---------------------------------------------------------------------------------


def test_contract_from_checkpoint_and_dataset_meta(tmp_path):
    ckpt = read_checkpoint(write_checkpoint(tmp_path / "c"))
    meta = read_dataset_meta(write_info(tmp_path / "ds" / "meta"))
    c = build_contract(contract_data(ckpt, meta, ContractOptions(**{**vars(OPTS), "cameras": {"top": "wrist"}})))
    assert [cam.name for cam in c.cameras] == ["wrist"] and c.cameras[0].input == "image_wrist"
    raw, model = c.cameras[0].raw, c.cameras[0].model
    assert (raw.height, raw.width, raw.layout, raw.dtype) == (32, 48, "HWC", "uint8")
    assert (model.layout, model.scale, model.resize) == ("CHW", 255.0, "none")
    assert c.proprio.names == ("joint0.position", "joint1.position", "joint0.velocity", "joint1.velocity")
    assert [j.name for j in c.action.joints] == ["joint0", "joint1"]
    assert c.timing.control_period_ms == pytest.approx(1000 / 30)
    assert c.timing.action_validity_ms == pytest.approx(5 * 1000 / 30)  # n_action_steps periods
    assert c.action.chunk_length == 10 and c.history is None and c.noise is None
    # the guard's bounds hold the data's range, widened
    s = ckpt.stats["action"]
    for j, joint in enumerate(c.action.joints):
        assert joint.lower < s["min"][j] and joint.upper > s["max"][j]
    # the TOML round trip gives back the same contract, float32 values bit for bit
    (tmp_path / "contract.toml").write_text(contract_toml(contract_data(ckpt, meta, OPTS), "a header"))
    from vlad.contract import load_contract

    again = load_contract(tmp_path / "contract.toml")
    assert np.array_equal(np.float32(again.proprio.std), affine(ckpt, ckpt.state)[1])


@pytest.mark.parametrize("mode", ["MEAN_STD", "MIN_MAX", "IDENTITY"])
def test_normalization_modes_as_mean_and_std(tmp_path, mode):
    """(x - mean) / std reproduces LeRobot's formula for each mode (numpy, float32)."""
    ckpt = read_checkpoint(write_checkpoint(tmp_path / "c", norm={"STATE": mode, "ACTION": mode, "VISUAL": mode}))
    s = ckpt.stats["observation.state"]
    x = np.random.default_rng(1).uniform(-2, 2, (100, 4)).astype(np.float32)
    mean, std = affine(ckpt, ckpt.state)
    got = (x - mean) / std
    if mode == "MEAN_STD":
        want = (x - s["mean"]) / (s["std"] + np.float32(1e-8))
    elif mode == "MIN_MAX":
        want = 2 * (x - s["min"]) / (s["max"] - s["min"]) - 1
    else:
        want = x
    np.testing.assert_allclose(got, want, atol=2e-6)
    # decoding is the inverse (LeRobot unnormalizes without eps)
    a = ckpt.stats["action"]
    amean, astd = affine(ckpt, ckpt.action, decode=True)
    y = np.linspace(-1, 1, 2, dtype=np.float32)
    if mode == "MEAN_STD":
        np.testing.assert_allclose(y * astd + amean, y * a["std"] + a["mean"], atol=1e-6)
    elif mode == "MIN_MAX":
        np.testing.assert_allclose(y * astd + amean, (y + 1) / 2 * (a["max"] - a["min"]) + a["min"], atol=1e-6)


def test_history_and_noise_of_a_diffusion_checkpoint(tmp_path):
    cfg = {"n_obs_steps": 2, "horizon": 16, "n_action_steps": 8, "num_inference_steps": 10, "num_train_timesteps": 100}
    ddim = read_checkpoint(write_checkpoint(tmp_path / "ddim", "diffusion", noise_scheduler_type="DDIM", **cfg))
    c = build_contract(contract_data(ddim, None, ContractOptions(**{**vars(OPTS), "fps": 10})))
    assert c.frames == 2 and c.input("image_top").shape == (1, 2, 3, 32, 48) and c.input("state").shape == (1, 2, 4)
    assert c.noise.shape == (16, 2) and c.noise.denoising_steps == 10 and c.action.chunk_length == 8
    ddpm = read_checkpoint(write_checkpoint(tmp_path / "ddpm", "diffusion", noise_scheduler_type="DDPM", **cfg))
    c = build_contract(contract_data(ddpm, None, ContractOptions(**{**vars(OPTS), "fps": 10})))
    assert c.noise.shape == (11, 16, 2)  # the initial sample and one per step


def test_what_the_checkpoint_does_not_know_is_asked_for(tmp_path):
    ckpt = read_checkpoint(write_checkpoint(tmp_path / "c"))
    with pytest.raises(CheckpointError, match="control rate is unknown: pass --dataset-meta"):
        contract_data(ckpt, None, OPTS)
    with pytest.raises(CheckpointError, match="units of observation.state are unknown.*--state-units"):
        contract_data(ckpt, None, ContractOptions(release_id="t", fps=30))
    with pytest.raises(CheckpointError, match="--action-units: 3 units for 2 entries"):
        contract_data(ckpt, None, ContractOptions(**{**vars(OPTS), "fps": 30, "action_units": ("rad",) * 3}))
    with pytest.raises(CheckpointError, match="--camera front=...: the policy has no such camera"):
        contract_data(ckpt, None, ContractOptions(**{**vars(OPTS), "fps": 30, "cameras": {"front": "x"}}))


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-3, 3), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=3),
)
KEYS = [
    "type",
    "n_obs_steps",
    "chunk_size",
    "n_action_steps",
    "horizon",
    "num_inference_steps",
    "num_train_timesteps",
    "noise_scheduler_type",
    "prediction_type",
    "normalization_mapping",
    "input_features",
    "output_features",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ptype=st.sampled_from(["act", "diffusion"]), key=st.sampled_from(KEYS), value=HOSTILE)
def test_hostile_config_values_are_refused_in_one_line(tmp_path, ptype, key, value):
    """Whatever a config.json holds, the answer is a contract or a one-line CheckpointError /
    ContractError: never another exception."""
    from vlad.errors import ContractError

    root = write_checkpoint(
        tmp_path / f"c{abs(hash((ptype, key, repr(value))))}",
        ptype,
        horizon=16,
        num_train_timesteps=100,
        num_inference_steps=10,
        n_obs_steps=1,
    )
    cfg = json.loads((root / "config.json").read_text())
    cfg[key] = value
    (root / "config.json").write_text(json.dumps(cfg))
    try:
        ckpt = read_checkpoint(root)
        build_contract(contract_data(ckpt, None, ContractOptions(**{**vars(OPTS), "fps": 30})))
    except CheckpointError as exc:
        assert "\n" not in str(exc)
    except ContractError:
        pass


def test_cli_error_is_one_line(tmp_path, capsys):
    root = write_checkpoint(tmp_path / "c", ptype="pi0")
    code = vladctl_main(["import", "lerobot", str(root), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: policy type 'pi0' is not supported") and "\n" not in err
    assert not (tmp_path / "out").exists()


# -- symbolic links, names, ids ---------------------------------------------------------------------


def test_symlinked_files_are_hashed_by_what_they_point_to(tmp_path):
    """The Hugging Face cache links every snapshot file to a blob: the checksum covers the bytes
    behind each link, and the report names the links."""
    real = write_checkpoint(tmp_path / "real")
    linked = tmp_path / "snapshot"
    linked.mkdir()
    for f in real.iterdir():
        (linked / f.name).symlink_to(f)
    a, b = read_checkpoint(real), read_checkpoint(linked)
    assert b.files == a.files and b.sha256 == a.sha256
    assert b.links == {name: str(real / name) for name in a.files}
    stats = "policy_preprocessor_step_3_normalizer_processor.safetensors"
    from safetensors.numpy import load_file

    flat = load_file(str(real / stats))
    flat["observation.state.mean"] += np.float32(1)
    save_file(flat, str(real / stats))  # the linked statistics change: so does the checksum
    assert read_checkpoint(linked).sha256 != b.sha256
    (linked / "README.md").symlink_to(tmp_path / "gone.md")  # a dangling link is named, in one line
    with pytest.raises(CheckpointError, match="README.md: a symbolic link to .*gone.md, which is not a file"):
        read_checkpoint(linked)


@pytest.mark.parametrize(
    ("layout", "train_config", "want"),
    [
        ("hub/models--lerobot--act_so101_pick/snapshots/0a1b2c", None, "act_so101_pick"),
        ("outputs/train/so101_pick/checkpoints/005000/pretrained_model", None, "so101_pick"),
        ("outputs/train/run/checkpoints/last/pretrained_model", {"policy": {"repo_id": "me/act_cube"}}, "act_cube"),
        ("outputs/train/run/checkpoints/last/pretrained_model", {"job_name": "cube_v2"}, "cube_v2"),
        (
            "outputs/train/2026-01-01/10-00-00_act/checkpoints/last/pretrained_model",
            {"job_name": "act", "dataset": {"repo_id": "me/so101_cube"}},
            "act-so101_cube",
        ),
        ("my_policy/pretrained_model", None, "my_policy"),
    ],
    ids=["hub-cache", "run-folder", "policy-repo", "job-name", "default-job-name", "folder"],
)
def test_the_release_is_named_after_the_checkpoint(tmp_path, layout, train_config, want):
    from vlad_tools.importers.lerobot.checkpoint import release_name

    root = write_checkpoint(tmp_path / "x" / layout)
    if train_config is not None:
        (root / "train_config.json").write_text(json.dumps(train_config))
    name, source = release_name(read_checkpoint(root))
    assert name == want, source


def test_generic_names_are_warned_about(tmp_path):
    from vlad_tools.importers.lerobot.contract import naming_warnings

    ckpt = read_checkpoint(write_checkpoint(tmp_path / "c"))
    warnings = naming_warnings(ckpt, None)
    assert [w.split(" entries")[0] for w in warnings] == ["observation.state", "action"]
    assert "named state0..state3 (no dataset meta/info.json): pass --dataset-meta" in warnings[0]
    assert naming_warnings(ckpt, read_dataset_meta(write_info(tmp_path / "ds" / "meta"))) == []


# -- constant statistics, joints that never moved ------------------------------------------------


@pytest.mark.parametrize("constant", [10.0, -35.5, 0.0, 1e-3, 100.0])
def test_a_constant_min_max_entry_maps_as_lerobot_maps_it(tmp_path, constant):
    """LeRobot divides by eps where max = min, so the constant maps to -1; vlad's (x - mean) / std
    in float32 (the serving Preprocessor's arithmetic) must give exactly that."""

    def hold(flat):
        for stat in ("min", "max"):
            flat[f"observation.state.{stat}"][3] = np.float32(constant)

    ckpt = read_checkpoint(write_checkpoint(tmp_path / "c", norm={"STATE": "MIN_MAX"}, edit=hold))
    mean, std = affine(ckpt, ckpt.state)
    s = ckpt.stats["observation.state"]
    x = np.array([-1.0, 0.5, 0.25, constant], np.float32)
    got = (x - mean) / std
    eps = np.float32(ckpt.eps)
    lerobot = 2 * (x - s["min"]) / np.where(s["max"] == s["min"], eps, s["max"] - s["min"]) - 1
    assert got[3] == lerobot[3] == -1.0
    np.testing.assert_allclose(got[:3], lerobot[:3], atol=2e-6)


def test_a_joint_that_never_moved_needs_its_limits(tmp_path):
    """A gripper held still in the data has no range for the guard: one line naming the option,
    which then gives its bounds (the rate limit is then its whole range)."""

    def still(flat):
        for stat in ("min", "max"):
            flat[f"action.{stat}"][1] = np.float32(10.0)

    ckpt = read_checkpoint(write_checkpoint(tmp_path / "c", edit=still))
    meta = read_dataset_meta(write_info(tmp_path / "ds" / "meta"))
    with pytest.raises(CheckpointError) as e:
        contract_data(ckpt, meta, OPTS)
    assert str(e.value) == (
        "joint joint1 never moved in the training data (its actions are all 10 rad), so the guard has no range for it: "
        "give the robot's limits with --joint-limits joint1=LOWER:UPPER"
    )
    given = ContractOptions(**{**vars(OPTS), "joint_limits": {"joint1.pos": (0.0, 100.0)}})
    c = build_contract(contract_data(ckpt, meta, given, max_step=np.array([0.2, 0.0])))
    assert (c.action.joints[1].lower, c.action.joints[1].upper, c.action.joints[1].rate_limit) == (0.0, 100.0, 100.0)
    assert c.action.joints[0].rate_limit == pytest.approx(0.3)  # the moving joint keeps its limit from the data
    with pytest.raises(CheckpointError, match=r"--joint-limits elbow=...: no such joint \(joints: joint0, joint1\)"):
        contract_data(ckpt, meta, ContractOptions(**{**vars(OPTS), "joint_limits": {"elbow": (0.0, 1.0)}}))


def test_guard_bounds_hold_the_data_after_rounding(tmp_path):
    """A narrow range is rounded outwards: 6 significant digits never collapse it."""

    def narrow(flat):
        flat["action.min"][0], flat["action.max"][0] = np.float32(10.0), np.float32(10.000001)

    ckpt = read_checkpoint(write_checkpoint(tmp_path / "c", edit=narrow))
    c = build_contract(contract_data(ckpt, read_dataset_meta(write_info(tmp_path / "ds" / "meta")), OPTS))
    joint = c.action.joints[0]
    assert joint.lower <= 10.0 < 10.000001 <= joint.upper and joint.lower < joint.upper


@pytest.mark.parametrize("value", ["gripper", "gripper=0", "gripper=5:1", "gripper=a:b", "=0:1", "gripper=0:nan"])
def test_cli_joint_limits_that_do_not_parse_are_one_line(tmp_path, capsys, value):
    root = write_checkpoint(tmp_path / "c")
    code = vladctl_main(["import", "lerobot", str(root), "--out", str(tmp_path / "out"), "--joint-limits", value])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: --joint-limits '{value}': expected NAME=LOWER:UPPER"), err
    assert "\n" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["input_features", "output_features"])
def test_a_feature_name_that_is_not_printable_is_refused_in_one_line(tmp_path, key):
    """Feature names reach every later message (cameras, contract names): a name with a line
    break or a control character is refused where it is read."""
    root = write_checkpoint(tmp_path / "c", "act")
    cfg = json.loads((root / "config.json").read_text())
    first = next(iter(cfg[key]))
    cfg[key]["bad\nname\x1b[2J"] = cfg[key].pop(first)
    (root / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="not a printable name") as exc:
        read_checkpoint(root)
    assert "\n" not in str(exc.value) and "\x1b" not in str(exc.value)
