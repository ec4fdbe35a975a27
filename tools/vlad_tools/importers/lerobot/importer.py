"""``vladctl import lerobot``: a LeRobot checkpoint in, a checked and signed vlad release out.

Steps (each one prints progress):

1. read the checkpoint (:mod:`.checkpoint`) and the dataset's ``meta/info.json``;
2. write the contract (:mod:`.contract`) and validate it with the one contract parser;
3. load the policy with LeRobot, build the export module (:mod:`.policies`);
4. run LeRobot's own ``preprocessor -> predict_action_chunk -> postprocessor`` on check
   windows (recorded from the dataset, else synthetic; with history, windows of distinct
   frames and restarted ones) and compare, per window: vlad's preprocessing (the serving
   ``Preprocessor``) with LeRobot's preprocessed tensors, and every artifact's output with
   LeRobot's chunk (max/mean abs) and, decoded by the contract, with LeRobot's actions
   per joint in physical units;
5. export ``policy.pt2`` and ``policy.onnx`` (:mod:`vlad.release.export`: checked against
   PyTorch) and write the golden fixtures the equivalence gate reads (``golden.npz``);
   SmolVLA served by ``torch``: also its flow head as ``policy_encoder.pt2`` and
   ``policy_velocity.pt2``, real-time chunking by guidance (the contract's in-graph
   inpainting stays, the ONNX Runtime fallback's), checked against LeRobot's chunk and a
   reference of the guidance in LeRobot's own time;
6. write ``import-report.json`` (lineage: LeRobot version, policy type, checkpoint sha256;
   every figure of step 4), the manifest, and sign it when a key is given.

Any check outside the fp32 budget fails the import (:class:`ImportCheckFailed`): a release
that does not compute what LeRobot computes is never written as one. Everything is written
into a staging folder beside ``--out`` and renamed to it only when the import succeeded, so
a failed import leaves no partial release (and ``--force`` replaces the old one only then).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from vlad.contract import Contract, load_contract
from vlad.errors import ExportError, VladError
from vlad.processing import Preprocessor, RawObservation, Tokenizer, decode_actions, make_noise, preprocess
from vlad.release.export import EXTERNAL_DATA_ABOVE
from vlad_tools.importers.lerobot.checkpoint import (
    Checkpoint,
    CheckpointError,
    DatasetMeta,
    dataset_of,
    max_action_step,
    read_checkpoint,
    read_dataset_meta,
    release_name,
)
from vlad_tools.importers.lerobot.contract import (
    ContractOptions,
    build_contract,
    camera_names,
    contract_data,
    contract_toml,
    naming_warnings,
)
from vlad_tools.importers.lerobot.fixtures import recorded_windows, synthetic_windows
from vlad_tools.importers.lerobot.policies import Frame, Reference, lerobot_reference, seeded_ddpm_noise

# fp32: the same arithmetic in another order. Outputs are normalized (order 1), so an
# absolute budget fits all policies; actions are judged per joint against the same budget
# scaled by the joint's own spread (its unnormalization std), i.e. in its physical units.
OUTPUT_MAX_ABS = 1e-4
OUTPUT_MEAN_ABS = 1e-5
PREPROCESS_MAX_ABS = 1e-5  # vlad's (x - mean) / std vs LeRobot's own formula (MIN_MAX: one rounding apart)
PRECISIONS = ("fp32", "fp16", "bf16")
# Real-time chunking by guidance (vlad_torch.guided): the flow head's programs, the torch
# backend's rtc_encoder / rtc_velocity options, and its default guidance cap (the paper's).
ENCODER, VELOCITY = "policy_encoder.pt2", "policy_velocity.pt2"
GUIDANCE = 5.0


class ImportCheckFailed(VladError):
    """An artifact or the preprocessing does not match LeRobot's own inference."""


@dataclass(frozen=True)
class ImportOptions:
    """Everything ``vladctl import lerobot`` takes besides the checkpoint and the output folder."""

    contract: ContractOptions
    dataset_meta: Path | None = None
    precision: str = "fp32"
    backend: str = "onnxruntime"
    version_code: int = 1
    windows: int = 6  # check windows (and golden fixtures)
    key: Path | None = None  # sign with this private key
    keys_dir: Path | None = None  # verify the signed release against these trusted keys
    valid_days: int = 365
    gate_plan: Mapping[str, Any] | None = None
    force: bool = False
    vlm_dir: Path | None = None  # SmolVLA: the local folder of its vision-language model
    instructions: tuple[str, ...] = ()  # instructions of synthetic check windows (SmolVLA)
    # SmolVLA: ship real-time chunking by guidance (the torch backend); None: with backend torch
    rtc_guidance: bool | None = None
    # weights of more bytes than this go to policy.onnx.data (ONNX external data; no CLI flag)
    external_data_above: int = EXTERNAL_DATA_ABOVE

    def guided(self, ckpt: Checkpoint) -> bool:
        """Whether this import ships the flow head for guidance (a checked choice)."""
        if self.rtc_guidance is None:
            return ckpt.type == "smolvla" and self.backend == "torch"
        if self.rtc_guidance and (ckpt.type != "smolvla" or self.backend != "torch"):
            raise CheckpointError(
                f"real-time chunking by guidance: a SmolVLA served by the torch backend (this is a {ckpt.type} "
                f"checkpoint, backend {self.backend})"
            )
        return self.rtc_guidance


@dataclass
class Stat:
    """Worst error over the check windows."""

    max_abs: float = 0.0
    mean_abs_sum: float = 0.0
    n: int = 0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        err = np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64))
        # NaN anywhere (on either side) is no agreement: count it as an infinite error
        # (max() would otherwise keep the old maximum: max(0.0, nan) is 0.0).
        err[~np.isfinite(err)] = math.inf
        self.max_abs = max(self.max_abs, float(err.max(initial=0.0)))
        self.mean_abs_sum += float(err.mean()) if err.size else 0.0
        self.n += 1

    @property
    def mean_abs(self) -> float:
        return self.mean_abs_sum / self.n if self.n else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"max_abs": self.max_abs, "mean_abs": self.mean_abs, "windows": self.n}


@dataclass
class ArtifactCheck:
    """One artifact against LeRobot: the normalized chunk and the actions per joint."""

    output: Stat = field(default_factory=Stat)
    joints: dict[str, Stat] = field(default_factory=dict)

    def add(self, contract: Contract, ref: Reference, out: np.ndarray) -> None:
        self.output.add(ref.output, out)
        actions = decode_actions(contract, {contract.action.output: out})
        for j, joint in enumerate(contract.action.joints):
            self.joints.setdefault(joint.name, Stat()).add(ref.actions[:, j], actions[:, j])

    def problems(self, name: str, contract: Contract) -> list[str]:
        out = []
        if self.output.max_abs > OUTPUT_MAX_ABS or self.output.mean_abs > OUTPUT_MEAN_ABS:
            out.append(
                f"{name}: chunk differs from LeRobot's by max {self.output.max_abs:.3g} / mean "
                f"{self.output.mean_abs:.3g} (budget {OUTPUT_MAX_ABS:g} / {OUTPUT_MEAN_ABS:g})"
            )
        for joint in contract.action.joints:
            budget = OUTPUT_MAX_ABS * max(joint.std, 1e-3) * contract.action.scale
            if self.joints[joint.name].max_abs > budget:
                out.append(
                    f"{name}: joint {joint.name} differs from LeRobot's by "
                    f"{self.joints[joint.name].max_abs:.3g} {joint.unit} (budget {budget:.3g})"
                )
        return out

    def to_dict(self, contract: Contract) -> dict[str, Any]:
        return {
            "output": self.output.to_dict(),
            "joints": {j.name: {**self.joints[j.name].to_dict(), "unit": j.unit} for j in contract.action.joints},
        }


def _raw(frame: Frame, names: Mapping[str, str], sequence: int, t_ns: int) -> RawObservation:
    """A LeRobot frame as the robot sends it to vlad (cameras by the robot's names)."""
    return RawObservation(
        images={names[k]: v for k, v in frame.images.items()},
        proprio=np.asarray(frame.state, np.float32),
        instruction=frame.task,
        sequence=sequence,
        sensor_time_ns=t_ns,
    )


def _vlad_window(
    contract: Contract, window: Sequence[Frame], names, sequence: int, tokenizer: Tokenizer | None = None
) -> dict[str, np.ndarray]:
    """vlad's serving preprocessing of a window: the frames through one Preprocessor."""
    pre = Preprocessor(contract, tokenizer)
    period_ns = int(contract.timing.control_period_ms * 1e6)
    inputs: dict[str, np.ndarray] = {}
    for i, frame in enumerate(window):
        inputs = pre.fill(_raw(frame, names, sequence - len(window) + 1 + i, 1_000_000_000 + i * period_ns))
    return {k: v.copy() for k, v in inputs.items()}


def import_checkpoint(
    checkpoint: str | Path, out: str | Path, opts: ImportOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Import ``checkpoint`` into the release folder ``out``; returns the import report.

    ``out`` appears only when the import succeeded: the release is written into a staging
    folder beside it and renamed (a failure removes the staging folder, whatever it was).
    """
    if not 1 <= opts.windows <= 1000:
        raise CheckpointError(f"--windows {opts.windows}: expected 1 to 1000 check windows")
    if opts.precision not in PRECISIONS:
        raise CheckpointError(f"--precision {opts.precision}: expected one of {', '.join(PRECISIONS)}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} is not a folder: choose a new folder for the release")
    if out.exists() and any(out.iterdir()) and not opts.force:
        raise CheckpointError(f"{out} is not empty: choose a new folder or pass --force to replace it")
    ckpt = read_checkpoint(checkpoint)
    opts.guided(ckpt)  # an impossible choice fails before anything is written
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # a release folder as mkdir makes it (mkdtemp's is private)
    except OSError as exc:
        raise CheckpointError(f"{out}: cannot write the release there ({exc.strerror or exc})") from None
    try:
        report = _import(ckpt, staging, out, opts, log)
        _publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"import: wrote {out}")
    return report


def _publish(staging: Path, out: Path) -> None:
    """Rename the finished release to ``out``; an old ``out`` (empty, or replaced with
    ``--force``) goes only now, after the import succeeded."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.replace(out, old / out.name)
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _import(
    ckpt: Checkpoint, staging: Path, out: Path, opts: ImportOptions, log: Callable[[str], None]
) -> dict[str, Any]:
    """The import of ``ckpt`` written into ``staging`` (``out`` names the release in messages)."""
    from vlad_tools.importers.lerobot.runtime import lerobot_version, load_lerobot

    log(f"import: {ckpt.type} checkpoint {ckpt.path} (sha256 {ckpt.sha256[:16]}...)")
    if not opts.contract.release_id:
        name, source = release_name(ckpt)
        opts = replace(opts, contract=replace(opts.contract, release_id=f"lerobot-{name}"))
        log(f"import: model id {opts.contract.release_id} (from {source}; --release-id sets another)")
    meta, dataset_root = _dataset(ckpt, opts)
    warnings = naming_warnings(ckpt, meta)
    for w in warnings:
        log(f"import: warning: {w}")
    max_step = max_action_step(dataset_root, ckpt.action.shape[0]) if dataset_root else None
    language, vlm = None, None
    if ckpt.type == "smolvla":
        from vlad_tools.importers.lerobot.vlm import language_table, read_vlm_dir, write_release_tokenizer

        vlm = read_vlm_dir(opts.vlm_dir, ckpt)
        log(f"import: VLM {vlm.name} from {vlm.path} (configuration and tokenizer; weights from the checkpoint)")
        sha = write_release_tokenizer(vlm, staging / "tokenizer.json")
        language = language_table(vlm, sha, int(ckpt.config["tokenizer_max_length"]))
    data = contract_data(ckpt, meta, opts.contract, max_step, language)
    build_contract(data)  # every contract problem in one error, before anything heavy
    load_lerobot()
    given = sorted(opts.contract.joint_limits)
    limits_from = f"the data (--joint-limits for {', '.join(given)})" if given else "the data"
    (staging / "contract.toml").write_text(
        contract_toml(
            data,
            "vlad release contract (docs/contract.md), written by `vladctl import lerobot`\n"
            f"from a LeRobot {lerobot_version()} {ckpt.type} checkpoint (sha256 {ckpt.sha256}).\n"
            f"Review [[action.joints]] lower/upper/rate_limit: the guard's limits come from {limits_from}.",
        )
    )
    contract = load_contract(staging / "contract.toml")
    tokenizer = Tokenizer.from_contract(contract) if contract.language is not None else None
    names = {
        feature.key.removeprefix("observation.images."): robot
        for feature, robot in camera_names(ckpt, opts.contract.cameras)
    }

    log("import: loading the policy with LeRobot ...")
    from vlad_tools.importers.lerobot.policies import export_module, load_policy

    policy, pre, post = load_policy(ckpt, vlm.path if vlm else None)
    pad_id = contract.language.pad_id if contract.language is not None else 0
    module = export_module(policy, ckpt, [t.name for t in contract.inputs], pad_id)

    windows, source = _windows(ckpt, dataset_root, opts.windows, log, opts.instructions)
    report_checks, pairs, fixtures = _check_eager(
        ckpt, contract, policy, pre, post, module, windows, names, log, tokenizer
    )

    log("import: exporting policy.pt2 and policy.onnx ...")
    from vlad.release.export import export_onnx, export_program

    export_inputs = [fx["inputs"] for fx in fixtures]
    try:
        export_program(module, contract, export_inputs[0], staging / "policy.pt2")
        log("import: policy.pt2 written")
        comparisons = export_onnx(
            module,
            contract,
            export_inputs,
            staging / "policy.onnx",
            tolerance=OUTPUT_MAX_ABS,
            external_data_above=opts.external_data_above,
            log=log,
        )
    except ExportError as exc:
        raise ExportError(
            f"{out}: the {ckpt.type} policy does not export ({exc}); this configuration is not supported yet: "
            "report it with the checkpoint's config.json"
        ) from exc
    log("import: policy.onnx written")
    guided = opts.guided(ckpt)
    if guided:
        _export_flow_head(module, contract, export_inputs[0], staging)
        log(f"import: {ENCODER} and {VELOCITY} written (real-time chunking by guidance)")

    log("import: checking the artifacts against LeRobot ...")
    report_checks.update(_check_artifacts(contract, staging, pairs, PLAIN_RUNS + ((GUIDED_RUN,) if guided else ())))
    problems = list(report_checks.pop("problems", []))
    if guided:
        report_checks["rtc_guidance"] = _check_guidance(contract, module, staging, pairs[0][0], problems)
    pre_stat: Stat = report_checks["preprocessing"]
    if pre_stat.max_abs > PREPROCESS_MAX_ABS:  # first: a wrong input explains every output after it
        problems.append(
            f"preprocessing: vlad's model inputs differ from LeRobot's preprocessor by {pre_stat.max_abs:.3g} "
            f"(budget {PREPROCESS_MAX_ABS:g})"
        )
    problems += [
        p for name, c in report_checks.items() if isinstance(c, ArtifactCheck) for p in c.problems(name, contract)
    ]
    for name, c in report_checks.items():
        if isinstance(c, ArtifactCheck):
            joint = max(contract.action.joints, key=lambda j: c.joints[j.name].max_abs)
            log(
                f"import: {name} vs LeRobot: chunk max {c.output.max_abs:.3g} mean {c.output.mean_abs:.3g}; "
                f"worst joint {joint.name} {c.joints[joint.name].max_abs:.3g} {joint.unit}"
            )
    log(f"import: preprocessing vs LeRobot max {pre_stat.max_abs:.3g}")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ImportCheckFailed(f"{out}: the release does not compute what LeRobot computes: {problems[0]}{more}")
    _write_golden(staging / "golden.npz", fixtures)

    report = {
        "format": "vlad.lerobot-import/1",
        "lineage": {
            "source": "lerobot",
            "lerobot_version": lerobot_version(),
            "policy_type": ckpt.type,
            "checkpoint": str(ckpt.path),
            "checkpoint_sha256": ckpt.sha256,
            "checkpoint_files": ckpt.files,
            "checkpoint_links": ckpt.links,
            "dataset": str(dataset_root) if dataset_root else None,
            "fps": 1000.0 / contract.timing.control_period_ms,
        },
        "windows": {"count": len(windows), "source": source, "frames": ckpt.n_obs_steps},
        "budgets": {
            "output_max_abs": OUTPUT_MAX_ABS,
            "output_mean_abs": OUTPUT_MEAN_ABS,
            "preprocessing_max_abs": PREPROCESS_MAX_ABS,
            "joint_max_abs": "output_max_abs x joint std",
        },
        "checks": {
            k: (v.to_dict(contract) if isinstance(v, ArtifactCheck) else v.to_dict() if isinstance(v, Stat) else v)
            for k, v in report_checks.items()
        },
        "export": [{"name": c.name, "max_abs": c.max_abs, "mean_abs": c.mean_abs} for c in comparisons],
        "guard": {
            "rate_limit_from_data": max_step is not None and bool(np.all(max_step > 0)),
            # joints whose rate limit is their whole range: no data, or the joint never moved in it
            "rate_limit_from_bounds": [
                j.name for i, j in enumerate(contract.action.joints) if max_step is None or not max_step[i] > 0
            ],
            "joint_limits_given": sorted(opts.contract.joint_limits),
        },
        "warnings": warnings,
        "passed": True,
        "problems": [],
    }
    (staging / "import-report.json").write_text(json.dumps(report, indent=2) + "\n")
    _write_manifest(staging, out, ckpt, contract, opts, log)
    return report


def _dataset(ckpt: Checkpoint, opts: ImportOptions) -> tuple[DatasetMeta | None, Path | None]:
    if opts.dataset_meta is not None:
        meta = read_dataset_meta(opts.dataset_meta)
        return meta, meta.root if meta.root and (meta.root / "data").is_dir() else None
    root = dataset_of(ckpt)
    if root is None:
        return None, None
    return read_dataset_meta(root), root


def _windows(
    ckpt: Checkpoint, root: Path | None, n: int, log, instructions: Sequence[str] = ()
) -> tuple[list[list[Frame]], str]:
    windows: list[list[Frame]] = []
    source = "synthetic"
    if root is not None:
        try:
            windows = recorded_windows(ckpt, root, n)
            source = f"recorded ({root})"
        except Exception as exc:  # a dataset LeRobot cannot read here: fall back, say so
            log(f"import: cannot read frames from {root} ({str(exc).splitlines()[0]}); using synthetic frames")
    if not windows:
        windows = synthetic_windows(ckpt, n, instructions=instructions)
        source = "synthetic"
    log(f"import: {len(windows)} check windows of {ckpt.n_obs_steps} frame(s), {source}")
    return windows, source


def _noise(ckpt: Checkpoint, contract: Contract, sequence: int) -> np.ndarray | None:
    """The noise vlad feeds for ``sequence`` (the contract's rule); DDPM's per-step part is
    LeRobot's seeded draw instead, so that LeRobot can be the reference."""
    if contract.noise is None:
        return None
    if len(contract.noise.shape) == 3:
        return seeded_ddpm_noise(ckpt, sequence)
    return make_noise(contract, sequence)


def _check_eager(ckpt, contract, policy, pre, post, module, windows, names, log, tokenizer=None):
    """LeRobot's reference per window; vlad's preprocessing and the eager module against it.

    Returns the checks (with ``problems``: what no budget covers, e.g. a token id that
    differs), the (model inputs, LeRobot's answer) pairs the artifacts are checked on, and the
    golden fixtures: each check window's newest frame as a restarted window, with the
    contract's own noise (what the equivalence gate replays).
    """
    import torch

    pre_stat, eager = Stat(), ArtifactCheck()
    problems: list[str] = []
    pairs: list[tuple[dict[str, np.ndarray], Reference]] = []
    cams = [names[c.key.removeprefix("observation.images.")] for c in ckpt.cameras]
    tokens_checked = 0
    for k, window in enumerate(windows):
        sequence = 1000 + k
        noise = _noise(ckpt, contract, sequence)
        # distinct frames, and (with history) the same window restarted at its newest frame
        variants = [list(window)] + ([[window[-1]]] if len(window) > 1 else [])
        for frames in variants:
            ref = lerobot_reference(policy, pre, post, ckpt, frames, noise, seed=sequence)
            inputs = _vlad_window(contract, frames, names, sequence, tokenizer)
            if noise is not None:
                inputs[contract.noise.input] = noise
            # LeRobot's preprocessed tensors are the newest frame's: compare the window's last slot
            last = (lambda a: a[:, -1]) if ckpt.n_obs_steps > 1 else (lambda a: a)
            for cam, c in zip(cams, ckpt.cameras, strict=True):
                pre_stat.add(ref.inputs[c.key], last(inputs[f"image_{cam}"]))
            state = last(inputs["state"])
            pre_stat.add(ref.inputs["observation.state"], state)
            if contract.language is not None:
                problems += _token_problems(contract, ref, inputs, frames[-1].task)
                tokens_checked += 1
            with torch.inference_mode():
                out = module(*(torch.from_numpy(inputs[s.name]) for s in contract.inputs)).numpy()
            eager.add(contract, ref, out)
            pairs.append((inputs, ref))
        log(f"import: LeRobot reference {k + 1}/{len(windows)}")
    checks: dict[str, Any] = {"preprocessing": pre_stat, "pytorch (eager)": eager, "problems": problems}
    if contract.language is not None:
        log(f"import: tokens vs LeRobot's tokenizer: {tokens_checked - len(problems)}/{tokens_checked} identical")
    if contract.rtc is not None:
        checks["rtc"] = _check_rtc(contract, module, pairs[0][0], problems)

    fixtures = []
    for k, window in enumerate(windows):
        sequence = 2000 + k
        raw = _raw(window[-1], names, sequence, 0)
        inputs = preprocess(contract, tokenizer, raw)
        if contract.noise is not None and len(contract.noise.shape) != 3:
            ref = lerobot_reference(policy, pre, post, ckpt, [window[-1]], inputs[contract.noise.input], seed=sequence)
            output = ref.output  # LeRobot's own chunk for the contract's noise
        else:  # ACT (no noise) or DDPM (LeRobot draws its per-step noise itself): the checked module
            with torch.inference_mode():
                output = module(*(torch.from_numpy(inputs[s.name]) for s in contract.inputs)).numpy()
            if contract.noise is None:
                output = lerobot_reference(policy, pre, post, ckpt, [window[-1]], None).output
        fixtures.append({"raw": raw, "inputs": inputs, "output": output})
    return checks, pairs, fixtures


def _token_problems(contract: Contract, ref: Reference, inputs: dict[str, np.ndarray], task: str) -> list[str]:
    """vlad's token ids (the release tokenizer, padded to ``max_tokens``) against LeRobot's
    (padded to the longest task only), and the mask the export derives from them."""
    spec = contract.language
    assert spec is not None
    want = ref.inputs["observation.language.tokens"][0].astype(np.int64)
    mask = ref.inputs["observation.language.attention_mask"][0].astype(bool)
    got = inputs[spec.input][0]
    n = len(want)
    if n > len(got) or not np.array_equal(got[:n], want) or np.any(got[n:] != spec.pad_id):
        return [f"tokens: the release tokenizer gives {got.tolist()} for {task!r}, LeRobot's {want.tolist()}"]
    if not np.array_equal(got[:n] != spec.pad_id, mask):
        return [f"tokens: the mask tokens != pad_id ({spec.pad_id}) differs from LeRobot's for {task!r}"]
    return []


def _check_rtc(contract: Contract, module, inputs: dict[str, np.ndarray], problems: list[str]) -> dict[str, Any]:
    """Real-time chunking by inpainting, in the eager module: a waypoint of weight 1 is
    reproduced, the free ones still move, and a weight of 0 everywhere is the plain chunk."""
    import torch

    rtc = contract.rtc
    assert rtc is not None

    def run(actions: np.ndarray, weights: np.ndarray) -> np.ndarray:
        feed = {**inputs, rtc.actions_input: actions, rtc.weights_input: weights}
        with torch.inference_mode():
            return module(*(torch.from_numpy(np.ascontiguousarray(feed[s.name])) for s in contract.inputs)).numpy()

    plain = run(np.zeros_like(inputs[rtc.actions_input]), np.zeros_like(inputs[rtc.weights_input]))
    held = plain.shape[1] // 2
    target = plain + 0.5  # waypoints the plain chunk does not pass through
    weights = np.zeros_like(inputs[rtc.weights_input])
    weights[:, :held] = 1.0
    guided = run(target, weights)
    kept = float(np.abs(guided[:, :held] - target[:, :held]).max())
    moved = float(np.abs(guided[:, held:] - plain[:, held:]).max())
    if kept > OUTPUT_MAX_ABS:
        problems.append(f"rtc: waypoints of weight 1 come back {kept:.3g} off (budget {OUTPUT_MAX_ABS:g})")
    if not moved > 0:
        problems.append("rtc: the free waypoints ignore the inpainted ones (the guide does not reach the flow)")
    return {"method": rtc.method, "weight_1_max_abs": kept, "free_changed_max_abs": moved, "held": held}


GUIDED = {"threads": 1, "rtc_encoder": ENCODER, "rtc_velocity": VELOCITY}  # the torch backend's options
PLAIN_RUNS = (
    ("torch (policy.pt2)", "torch", "policy.pt2", {"threads": 1}),
    ("onnxruntime (policy.onnx)", "onnxruntime", "policy.onnx", {"intra_op_threads": 1}),
)
GUIDED_RUN = (f"torch guided ({ENCODER}, {VELOCITY})", "torch", "policy.pt2", GUIDED)


def _check_artifacts(contract: Contract, out: Path, pairs, runs=PLAIN_RUNS) -> dict[str, ArtifactCheck]:
    """The exported artifacts, run by vlad's own backends, against LeRobot's chunks (``runs``:
    name, backend, artifact, options; :data:`GUIDED_RUN`, the flow head's programs with the
    check windows' weights, all zero, must give LeRobot's plain chunk too)."""
    from vlad.plugins import get_backend

    checks: dict[str, ArtifactCheck] = {}
    for name, backend, artifact, options in runs:
        session = get_backend(backend).load(out / artifact, contract, options)
        try:
            check = ArtifactCheck()
            for inputs, ref in pairs:
                check.add(contract, ref, np.asarray(session.infer(inputs)[contract.action.output]))
            checks[name] = check
        finally:
            session.close()
    return checks


def _export_flow_head(module, contract: Contract, example: dict[str, np.ndarray], out: Path) -> None:
    """SmolVLA's flow head as the two ``torch.export`` programs of ``vlad_torch.guided``
    (batch of one, like the demo release's): the encoder from the observation inputs, the
    velocity (vlad's time) from its context, ``x`` and ``t``."""
    import torch

    from vlad.release.export import root_cause

    rtc, noise = contract.rtc, contract.noise
    assert rtc is not None and noise is not None
    skip = {noise.input, rtc.actions_input, rtc.weights_input}
    observation = tuple(torch.from_numpy(example[s.name]) for s in contract.inputs if s.name not in skip)
    encoder, velocity = module.flow_head()
    try:
        with torch.no_grad():
            context = encoder(*observation)
            x = torch.from_numpy(example[noise.input])
            t = torch.zeros(x.shape[0])
            torch.export.save(torch.export.export(encoder, observation), str(out / ENCODER))
            torch.export.save(torch.export.export(velocity, (*context, x, t)), str(out / VELOCITY))
    except Exception as exc:
        raise ExportError(f"torch.export of the flow head failed: {root_cause(exc)}") from exc


def _check_guidance(
    contract: Contract, module, out: Path, inputs: dict[str, np.ndarray], problems: list[str]
) -> dict[str, Any]:
    """The guided programs as the torch backend runs them, steered: the first half of the chunk
    weighted 1 towards waypoints 0.5 off LeRobot's plain chunk, against the same guidance written
    in LeRobot's time over its eager modules (within the output budget); the weighted waypoints
    come closer to their targets and the free ones move. Guidance pulls by the policy's own
    field (at most ``GUIDANCE`` times its vector-Jacobian product per step), so unlike the
    graph's inpainting it does not reproduce a waypoint of weight 1: the report gives how far."""
    from vlad.plugins import get_backend
    from vlad_tools.importers.lerobot.policies import smolvla_guided_reference

    rtc = contract.rtc
    assert rtc is not None
    session = get_backend("torch").load(out / "policy.pt2", contract, GUIDED)
    try:
        out_name = contract.action.output
        zero = {**inputs, rtc.weights_input: np.zeros_like(inputs[rtc.weights_input])}
        plain = np.asarray(session.infer(zero)[out_name])
        held = contract.action.chunk_length // 2
        target = (plain + 0.5).astype(np.float32)
        weights = np.zeros_like(inputs[rtc.weights_input])
        weights[:, :held] = 1.0
        feed = {**inputs, rtc.actions_input: target, rtc.weights_input: weights}
        got = np.asarray(session.infer(feed)[out_name])
    finally:
        session.close()
    ref = smolvla_guided_reference(module, contract, feed, GUIDANCE)
    err = float(np.abs(got - ref).max())
    before = float(np.abs(plain[:, :held] - target[:, :held]).mean())
    after = float(np.abs(got[:, :held] - target[:, :held]).mean())
    moved = float(np.abs(got[:, held:] - plain[:, held:]).max())
    if not err <= OUTPUT_MAX_ABS:
        problems.append(
            f"rtc guidance: the guided programs differ from the guidance in LeRobot's time by {err:.3g} "
            f"(budget {OUTPUT_MAX_ABS:g})"
        )
    if not after < before:
        problems.append(f"rtc guidance: weighted waypoints do not come closer ({before:.3g} -> {after:.3g} mean)")
    if not moved > 0:
        problems.append("rtc guidance: the free waypoints ignore the guide")
    return {
        "guidance": GUIDANCE,
        "held": held,
        "vs_reference_max_abs": err,
        "weight_1_mean_abs_before": before,
        "weight_1_mean_abs_after": after,
        "free_changed_max_abs": moved,
    }


def _write_golden(path: Path, fixtures: list[dict[str, Any]]) -> None:
    """The equivalence gate's golden fixtures (:func:`vlad_tools.gates.equivalence.save_golden`)."""
    from vlad_tools.gates.equivalence import save_golden

    save_golden(
        path, ({"raw": fx["raw"], "inputs": fx["inputs"], "outputs": {"actions": fx["output"]}} for fx in fixtures)
    )


DEFAULT_GATE_PLAN: dict[str, Any] = {
    # A robot's own closed-loop test plan has no simulator here: add closed_loop where one exists.
    "required": ["contract", "equivalence", "performance"],
    "equivalence": {
        "reference": {"backend": "torch", "artifact": "policy.pt2", "options": {"threads": 1}},
        "golden": "golden.npz",
        "recordings": [],
        "rollout_episodes": 0,
    },
}


def default_gate_plan(contract: Contract) -> dict[str, Any]:
    """:data:`DEFAULT_GATE_PLAN`, its fp32 action budget the import's own per joint: the gate has
    one number for every joint (2e-4 in the joint's unit by default, meant for radians), the
    import allows ``OUTPUT_MAX_ABS`` x the joint's std; the smallest of those, where it is
    larger (joints in degrees or gripper percent)."""
    from vlad_tools.gates.plan import DEFAULT_BUDGETS

    a = contract.action
    per_joint = min(OUTPUT_MAX_ABS * max(j.std, 1e-3) * a.scale for j in a.joints)
    plan = json.loads(json.dumps(DEFAULT_GATE_PLAN))
    default = DEFAULT_BUDGETS["fp32"].action_max_abs
    if per_joint > default:
        plan["equivalence"]["budgets"] = {"fp32": {"action_max_abs": float(f"{per_joint:.3g}")}}
    return plan


def _write_manifest(staging: Path, out: Path, ckpt: Checkpoint, contract: Contract, opts: ImportOptions, log) -> None:
    """The manifest of the release in ``staging`` (to become ``out``), signed and verified on request."""
    from vlad.release.authoring import new_manifest_data, write_manifest
    from vlad.release.signing import installed_runtime, sign_release, verify_release

    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    runtime = installed_runtime()
    options: dict[str, Any] = {"intra_op_threads": 1} if opts.backend == "onnxruntime" else {}
    if opts.guided(ckpt):  # the torch backend integrates the flow itself, guided
        options.update(rtc_encoder=ENCODER, rtc_velocity=VELOCITY)
    if opts.precision != "fp32":
        options["precision"] = opts.precision
    artifact = "policy.onnx" if opts.backend in ("onnxruntime", "tensorrt", "kserve") else "policy.pt2"
    data = new_manifest_data(
        staging,
        release_id=f"{contract.model.id}-{contract.model.version}",
        version=contract.model.version,
        version_code=opts.version_code,
        description=f"LeRobot {ckpt.type} policy (checkpoint sha256 {ckpt.sha256[:16]}...), imported by vladctl",
        backend=opts.backend,
        artifact=artifact,
        options=options,
        not_before=now - dt.timedelta(days=1),
        expires=now + dt.timedelta(days=opts.valid_days),
        runtime={k: getattr(runtime, k) for k in ("python", "torch", "onnxruntime") if getattr(runtime, k, None)},
        fallback=[{"kind": "hold"}],
        lineage={"change": "retrain"},
        roles={"golden.npz": "report", "import-report.json": "report", "policy.onnx.data": "weights"},
    )
    data["gate_plan"] = dict(opts.gate_plan) if opts.gate_plan is not None else default_gate_plan(contract)
    manifest = write_manifest(staging, data)
    log(f"import: manifest.toml written ({len(manifest.artifacts)} artifacts)")
    if opts.key is None:
        log(f"import: not signed; sign with `vladctl sign {out} --key KEY`")
        return
    sig = sign_release(staging, opts.key)
    log(f"import: signed with key {sig.key_id}")
    if opts.keys_dir is not None:
        v = verify_release(staging, opts.keys_dir, now)
        log(f"import: verified {v.id} against {opts.keys_dir}")
