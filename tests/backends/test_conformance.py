"""One conformance suite for every backend variant: same fixtures, same assertions.

Parametrized over the variants of the backends the loaded plugins offer, CPU and GPU (see
conftest.py); a variant whose runtime or device is missing here skips with its reason.
References are the golden fixtures' outputs, i.e. PyTorch fp32 outputs of the very model
that was exported, so nothing here depends on particular weights. Each session is judged
against the budget of the precision it reports (vlad_tools.testing.golden.MAX_ABS).
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import numpy as np
import pytest

from vlad.backend import Session, example_inputs, host_rss_bytes
from vlad.errors import InputRejected, ObservationError
from vlad.processing import RawObservation, Tokenizer, preprocess
from vlad_tools.testing.golden import MAX_ABS

# ./scripts/test --slow soaks 10,000 calls after 500 warm-up ones; the default run soaks a
# short version (1,000 after 200: seconds, not minutes, for eager torch at ~6 ms/call).
SOAK_CALLS = {True: 10_000, False: 1_000}
SOAK_WARMUP = {True: 500, False: 200}
SOAK_GROWTH_LIMIT = 20 * 1024 * 1024


def budget(session: Session) -> float:
    """The error budget of the precision the session says it computes in."""
    return MAX_ABS[session.describe().precision]


def error_report(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Max / mean absolute and max relative error of ``got`` against ``ref``."""
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    rel = err / np.maximum(np.abs(ref.astype(np.float64)), 1e-6)
    return {"max_abs": float(err.max()), "mean_abs": float(err.mean()), "max_rel": float(rel.max())}


def batched(inputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([x[name] for x in inputs]) for name in inputs[0]}


# ---------------------------------------------------------------------------------------
# Identity and loading
# ---------------------------------------------------------------------------------------


def test_availability(backend, variant):
    avail = backend.availability()
    assert avail.usable and avail.version and avail.runtime
    assert avail.devices, "a usable backend names the devices it can run on"
    assert any(d.startswith(variant.device) for d in avail.devices), (variant.device, avail.devices)


def test_describe(session: Session, variant, artifact, options):
    d = session.describe()
    assert d.backend == variant.backend
    assert d.runtime and d.runtime_version
    assert d.device.startswith(variant.device)
    assert d.precision == options.get("precision", "fp32")
    assert d.artifact == str(artifact)
    assert isinstance(d.providers, tuple)


def test_engine_caches_stay_out_of_the_robot_state(options, engine_cache_root):
    """Tests build engines into a temporary folder, never /var/lib/vlad."""
    from .conftest import PRODUCTION_STATE

    if "cache_dir" in options:
        assert Path(options["cache_dir"]).is_relative_to(engine_cache_root)
    assert not engine_cache_root.is_relative_to(PRODUCTION_STATE)


def test_cold_load_and_first_inference(backend, artifact, contract, options, golden):
    t0 = time.perf_counter()
    with backend.load(artifact, contract, options) as sess:
        inputs, ref = golden[0]
        out = sess.infer(inputs)
        cold_s = time.perf_counter() - t0
        for name, r in ref.items():
            assert error_report(r, out[name])["max_abs"] <= budget(sess)
    sess.close()  # idempotent
    print(f"cold load + first inference: {cold_s:.2f} s")


# ---------------------------------------------------------------------------------------
# Equivalence with the PyTorch fp32 reference
# ---------------------------------------------------------------------------------------


def test_golden_fixtures(session: Session, golden, record_property):
    limit = budget(session)
    for i, (inputs, ref) in enumerate(golden):
        out = session.infer(inputs)
        assert set(out) == set(ref)
        for name, r in ref.items():
            assert out[name].shape == r.shape and out[name].dtype == r.dtype
            report = error_report(r, out[name])
            record_property(f"fixture{i}/{name}", report)
            print(f"fixture {i} {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in report.items()))
            assert report["max_abs"] <= limit, f"fixture {i} {name}: {report}"


def test_batch_of_two_equals_two_single_runs(session: Session, golden):
    (a, _), (b, _) = golden[0], golden[1]
    # Copies: a session may reuse its output buffers from one call to the next.
    single = [{k: v.copy() for k, v in session.infer(x).items()} for x in (a, b)]
    pair = {k: v.copy() for k, v in session.infer(batched([a, b])).items()}
    for name, out in pair.items():
        assert out.shape[0] == 2
        for j in range(2):
            report = error_report(single[j][name][0], out[j])
            assert report["max_abs"] <= budget(session), f"{name}[{j}]: {report}"


def test_max_batch(session: Session, contract, golden):
    top = max(ax.max for spec in contract.inputs for ax in spec.dynamic if ax.name == "batch")
    inputs = batched([golden[i % len(golden)][0] for i in range(top)])
    out = session.infer(inputs)
    for i in range(top):
        ref = golden[i % len(golden)][1]
        for name, r in ref.items():
            assert error_report(r[0], out[name][i])["max_abs"] <= budget(session)


# ---------------------------------------------------------------------------------------
# Inputs refused before the engine
# ---------------------------------------------------------------------------------------


def _bad_inputs(case: str, inputs: dict[str, np.ndarray]) -> dict:
    x = {k: v.copy() for k, v in inputs.items()}
    if case == "wrong-name":
        x["image_front"] = x.pop("image_overhead")
    elif case == "missing-input":
        del x["tokens"]
    elif case == "extra-input":
        x["depth"] = np.zeros((1, 1), np.float32)
    elif case == "float64-image":
        x["image_overhead"] = x["image_overhead"].astype(np.float64)
    elif case == "int32-tokens":
        x["tokens"] = x["tokens"].astype(np.int32)
    elif case == "wrong-shape":
        x["image_overhead"] = np.zeros((1, 3, 32, 32), np.float32)
    elif case == "wrong-rank":
        x["proprio"] = x["proprio"][0]
    elif case == "batch-9-over-max":
        x = {k: np.concatenate([v] * 9) for k, v in x.items()}
    elif case == "batch-mismatch":
        x["image_overhead"] = np.concatenate([x["image_overhead"]] * 2)
    elif case == "not-an-array":
        x["proprio"] = x["proprio"].tolist()
    else:
        raise AssertionError(case)
    return x


BAD_CASES = [
    "wrong-name",
    "missing-input",
    "extra-input",
    "float64-image",
    "int32-tokens",
    "wrong-shape",
    "wrong-rank",
    "batch-9-over-max",
    "batch-mismatch",
    "not-an-array",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_refuses_bad_inputs_before_the_engine(session: Session, golden, case, monkeypatch):
    calls = []
    monkeypatch.setattr(session, "_run", lambda inputs: calls.append(inputs))
    with pytest.raises(InputRejected):
        session.infer(_bad_inputs(case, golden[0][0]))
    assert not calls, "a refused input reached the engine"


# ---------------------------------------------------------------------------------------
# Non-finite values
# ---------------------------------------------------------------------------------------


def test_nonfinite_observation_is_refused_by_preprocessing(contract, raw_golden):
    """The contract's rule: a non-finite observation never becomes a model input."""
    tokenizer = Tokenizer.from_contract(contract)
    proprio = raw_golden["0/raw/proprio"].copy()
    obs = RawObservation(
        images={"overhead": raw_golden["0/raw/image/overhead"]},
        proprio=proprio,
        instruction=str(raw_golden["0/raw/instruction"]),
        sequence=int(raw_golden["0/raw/sequence"]),
    )
    preprocess(contract, tokenizer, obs)  # the clean observation passes
    for bad in (np.nan, np.inf, -np.inf):
        proprio[1] = bad
        with pytest.raises(ObservationError, match="non-finite"):
            preprocess(contract, tokenizer, obs)


@pytest.mark.parametrize("tensor", ["image_overhead", "proprio", "noise"])
def test_nan_tensor_gives_nonfinite_outputs_not_a_crash(session: Session, golden, tensor):
    """Past preprocessing a NaN is the final guard's job: the engine must just propagate it."""
    inputs = {k: v.copy() for k, v in golden[0][0].items()}
    inputs[tensor][:] = np.nan
    out = session.infer(inputs)
    assert not all(np.isfinite(v).all() for v in out.values())
    # And the session is still healthy afterwards.
    clean, ref = golden[0]
    out = session.infer(clean)
    for name, r in ref.items():
        assert error_report(r, out[name])["max_abs"] <= budget(session)


# ---------------------------------------------------------------------------------------
# Warm-up, timing, memory
# ---------------------------------------------------------------------------------------


def test_warmup_and_timing(session: Session, contract):
    session.last_timing = type(session.last_timing)()
    session.warmup(2)
    t = session.last_timing
    assert t.compute_ms > 0
    assert t.total_ms >= t.compute_ms
    if session.describe().device.startswith("cpu"):
        assert t.h2d_ms is None and t.d2h_ms is None  # nothing to copy on the host
    session.infer(example_inputs(contract, batch=2))
    assert session.last_timing.compute_ms > 0


def test_memory_reports_rss(session: Session):
    mem = session.memory()
    assert mem.host_rss_bytes > 50 * 1024 * 1024  # a Python process with a model loaded
    assert abs(mem.host_rss_bytes - host_rss_bytes()) < 64 * 1024 * 1024


def test_soak(session: Session, golden, variant, request):
    """10,000 inferences (1,000 without --slow) without host memory growth (RSS after warm-up vs at the end)."""
    full = bool(request.config.getoption("--slow"))
    calls, warmup = SOAK_CALLS[full], SOAK_WARMUP[full]
    feeds = [inputs for inputs, _ in golden]
    for i in range(warmup):
        session.infer(feeds[i % len(feeds)])
    gc.collect()
    before = host_rss_bytes()
    t0 = time.perf_counter()
    for i in range(calls):
        session.infer(feeds[i % len(feeds)])
    elapsed = time.perf_counter() - t0
    gc.collect()
    growth = host_rss_bytes() - before
    print(f"{variant.id}: {calls} calls in {elapsed:.1f} s, RSS growth {growth / 2**20:.2f} MiB")
    assert growth < SOAK_GROWTH_LIMIT, f"RSS grew by {growth / 2**20:.1f} MiB over {calls} calls"


# ---------------------------------------------------------------------------------------
# Device paths (GPU variants)
# ---------------------------------------------------------------------------------------


def test_device_timing_split_and_memory(session: Session, variant, golden):
    """On a GPU the time splits into host-to-device, compute and device-to-host, and the
    session reports the device memory it holds."""
    if not variant.gpu:
        pytest.skip(f"{variant.id}: runs on the host, nothing to copy to a device")
    session.infer(golden[0][0])
    t = session.last_timing
    assert t.h2d_ms is not None and t.d2h_ms is not None and t.compute_ms > 0
    assert min(t.h2d_ms, t.d2h_ms) >= 0
    if variant.backend != "onnxruntime":  # ORT does not report its arena
        assert session.memory().device_peak_bytes
