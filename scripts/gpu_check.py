#!/usr/bin/env python3
"""One-command GPU check: coherent environment, every GPU test, a PASS/FAIL table and figures.

On a machine with an NVIDIA GPU (``scripts/gpu-check``):

1. reads the driver version and compute capability (``nvidia-smi``);
2. picks the coherent stack for that driver: CUDA 13 (driver >= 580, cc >= 7.5) or CUDA 12
   (driver >= 525): vlad's ``gpu-cuXX`` + ``tensorrt-cuXX`` extras, torch from PyPI (CUDA 13)
   or PyTorch's cu12x index, TensorRT's libraries from pypi.nvidia.com;
3. creates its own venv (``.cache/gpu-check/venv``; reused while the install inputs are
   unchanged) with exactly that stack: never the ``cpu`` extra beside ``gpu``;
4. runs every GPU test, the one GPU suite (``pytest -m "gpu and not slow" tests/backends``):
   the conformance suite's GPU variants, the backends' own GPU tests (CUDA-graph replay with
   new data, corrupted engine rebuilt ...) and ``tests/backends/test_gpu_measures.py``
   (golden error per backend and precision label, warm latency and timing split, TF32
   on/off, 10x load/close memory, cold start and outputs after close in a child process);
5. prints a PASS/FAIL table and writes every figure the tests recorded (JUnit properties),
   the speed-ups over torch eager and the conditions (``vlad_tools.gates.conditions``) to a
   JSON file.

Without a GPU it prints one line saying so and exits 0, after a dry run of its own logic
(driver parsing, stack choice, extras resolution and exclusivity, install commands, test
report parsing, table and JSON); that dry run is exercised by the test suite.

Only the standard library is used here: this runs before any venv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".cache" / "gpu-check"
NVIDIA_INDEX = "https://pypi.nvidia.com"
# PyTorch's CUDA 12 wheel indexes, newest first: torch==2.13.0 from PyPI is a CUDA 13 build.
TORCH_CU12_INDEXES = (
    "https://download.pytorch.org/whl/cu129",
    "https://download.pytorch.org/whl/cu128",
    "https://download.pytorch.org/whl/cu126",
)
TEST_SELECTION = "gpu and not slow"
# Minimum drivers (Linux) per CUDA major: CUDA 13.0 needs r580; CUDA 12.x runs on r525+
# through minor-version compatibility.
MIN_DRIVER = {13: 580, 12: 525}
# CUDA 13 dropped Maxwell, Pascal and Volta.
CUDA13_MIN_CC = (7, 5)
# What one run may take, at most, per phase (the whole check targets < 8 min on one
# data-centre GPU and 16 cores; the install dominates on a cold cache).
PHASE_TIMEOUT_S = {"install": 900, "tests": 1200, "conditions": 120}
# The target every speed-up is measured against (warm p50, tests/backends/test_gpu_measures.py).
SPEEDUP_BASE = "torch[cuda] fp32"

SAMPLE_SMI = "NVIDIA H100 80GB HBM3, 580.65.06, 9.0, 81559\nNVIDIA T4, 535.104.05, 7.5, 15360\n"
SAMPLE_JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.backends.test_tensorrt" name="test_gpu_engine_matches_onnxruntime[fp32]" time="1.0"/>
<testcase classname="tests.backends.test_gpu_measures" name="test_gpu_golden_error_within_the_label_budget_and_warm_latency[torch[cuda]-fp32]" time="2.0">
<properties><property name="target" value="torch[cuda] fp32"/><property name="p50_ms" value="1.5"/></properties></testcase>
<testcase classname="tests.backends.test_gpu_measures" name="test_gpu_golden_error_within_the_label_budget_and_warm_latency[tensorrt-fp16]" time="2.0">
<properties><property name="target" value="tensorrt fp16"/><property name="p50_ms" value="0.5"/></properties></testcase>
<testcase classname="tests.backends.test_tensorrt" name="test_gpu_engine_matches_onnxruntime[fp16]" time="1.0">
<failure message="AssertionError: max abs 0.2 &gt; 0.03">trace</failure></testcase>
<testcase classname="tests.backends.test_torch" name="test_gpu_reduced_precisions_are_their_own_labels[bf16]" time="0.1">
<skipped message="bf16 needs compute capability &gt;= 8.0"/></testcase>
</testsuite></testsuites>"""


# ---------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it."""

    name: str
    driver: str
    compute_capability: tuple[int, int]
    memory_mib: int

    @property
    def driver_major(self) -> int:
        return int(self.driver.split(".")[0])


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total
    --format=csv,noheader,nounits``; lines that do not parse are skipped."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        name, driver, cap, mem = parts
        try:
            major, minor = (int(x) for x in cap.split("."))
            gpus.append(Gpu(name, driver, (major, minor), int(float(mem))))
        except ValueError:
            continue
    return gpus


def detect_gpus(smi: str | None = None) -> tuple[list[Gpu], str]:
    """The GPUs nvidia-smi sees, or ``([], why not)``."""
    smi = smi or shutil.which("nvidia-smi")
    if not smi or not os.path.exists(smi):
        return [], "nvidia-smi not found"
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}"
    gpus = parse_nvidia_smi(out.stdout)
    if out.returncode != 0 or not gpus:
        first = (out.stderr or out.stdout).strip().splitlines()[:1]
        return [], f"nvidia-smi found no GPU ({first[0] if first else f'exit {out.returncode}'})"
    return gpus, ""


# ---------------------------------------------------------------------------------------
# The stack for a driver
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    """A coherent set of wheels for one CUDA major, and how to install it."""

    cuda_major: int
    extras: tuple[str, ...]
    torch_indexes: tuple[str, ...] = ()  # empty: torch from PyPI
    extra_indexes: tuple[str, ...] = (NVIDIA_INDEX,)
    why: str = ""

    @property
    def spec(self) -> str:
        return f"vlad[{','.join(self.extras)}]"


def choose_stack(gpu: Gpu) -> Stack:
    """The stack this driver and GPU can run, or ValueError saying why none can."""
    if gpu.driver_major >= MIN_DRIVER[13] and gpu.compute_capability >= CUDA13_MIN_CC:
        return Stack(
            13,
            ("torch", "gpu-cu13", "tensorrt-cu13", "export"),
            why=f"driver {gpu.driver} >= {MIN_DRIVER[13]} and cc {_cc(gpu)} >= 7.5: CUDA 13",
        )
    if gpu.driver_major >= MIN_DRIVER[12]:
        reason = (
            f"cc {_cc(gpu)} < 7.5 (CUDA 13 dropped it)"
            if gpu.driver_major >= MIN_DRIVER[13]
            else f"driver {gpu.driver} < {MIN_DRIVER[13]}"
        )
        return Stack(12, ("torch", "gpu-cu12", "tensorrt-cu12", "export"), TORCH_CU12_INDEXES, why=f"{reason}: CUDA 12")
    raise ValueError(f"driver {gpu.driver} is older than {MIN_DRIVER[12]} (CUDA 12); update the NVIDIA driver")


def _cc(gpu: Gpu) -> str:
    return f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}"


def extras_closure(pyproject: Path, extras: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The extras reached from ``extras`` (self-references ``vlad[x]`` followed) and every
    requirement they pull. Raises ValueError for an unknown extra."""
    table = tomllib.loads(Path(pyproject).read_text())["project"]["optional-dependencies"]
    reqs: list[str] = []
    seen: list[str] = []

    def visit(extra: str) -> None:
        if extra in seen:
            return
        if extra not in table:
            raise ValueError(f"pyproject.toml has no extra {extra!r}")
        seen.append(extra)
        for req in table[extra]:
            if req.startswith("vlad["):
                for inner in req[len("vlad[") : req.index("]")].split(","):
                    visit(inner.strip())
            elif req not in reqs:
                reqs.append(req)

    for e in extras:
        visit(e)
    return seen, reqs


def resolve_extras(pyproject: Path, extras: tuple[str, ...]) -> list[str]:
    """Every requirement the given extras of vlad pull."""
    return extras_closure(pyproject, extras)[1]


def requirement_name(req: str) -> str:
    """``"onnxruntime-gpu[cuda,cudnn]>=1.27,<1.32"`` -> ``"onnxruntime-gpu"``."""
    name = req
    for stop in "[<>=!~; ":
        name = name.split(stop, 1)[0]
    return name.strip().lower().replace("_", "-")


def exclusivity_problems(pyproject: Path, extras: tuple[str, ...]) -> list[str]:
    """What in one environment would break: both ONNX Runtime wheels, or CUDA 12 and 13
    stacks side by side (by extra name ``*-cuNN`` or wheel name ``*-cuNN``)."""
    seen, reqs = extras_closure(pyproject, extras)
    names = {requirement_name(r) for r in reqs}
    problems = []
    if {"onnxruntime", "onnxruntime-gpu"} <= names:
        problems.append("onnxruntime and onnxruntime-gpu in one environment (the cpu and gpu extras are exclusive)")
    majors = {m for n in (*names, *seen) for m in (12, 13) if n.endswith(f"-cu{m}")}
    if len(majors) > 1:
        problems.append(f"CUDA {sorted(majors)} wheels in one environment")
    return problems


def install_commands(python: Path, stack: Stack, root: Path = ROOT) -> list[list[str]]:
    """pip commands that install the stack and the plugins into the venv of ``python``."""
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    extra = [a for idx in stack.extra_indexes for a in ("--extra-index-url", idx)]
    torch_pin = next(r for r in resolve_extras(root / "pyproject.toml", ("torch",)) if requirement_name(r) == "torch")
    commands = [[*pip, "--upgrade", "pip"]]
    if stack.torch_indexes:
        # One index per attempt (see run_install): the first that has the pinned torch wins.
        commands.append(
            [*pip, torch_pin, "--index-url", stack.torch_indexes[0], "--extra-index-url", "https://pypi.org/simple"]
        )
    plugins = [a for d in sorted((root / "plugins").glob("*/pyproject.toml")) for a in ("-e", str(d.parent))]
    commands.append(
        [*pip, *extra, "-e", f"{root}[{','.join(stack.extras)}]", *plugins, "pytest>=8", "pytest-timeout>=2.3"]
    )
    return commands


def install_inputs_digest(stack: Stack, root: Path = ROOT) -> str:
    """What the venv's contents depend on: reinstall when it changes."""
    h = hashlib.sha256(json.dumps(asdict(stack), sort_keys=True).encode())
    for p in [root / "pyproject.toml", *sorted((root / "plugins").glob("*/pyproject.toml"))]:
        h.update(p.read_bytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table."""

    check: str
    status: str  # PASS, FAIL, SKIP, N/A
    detail: str = ""
    figures: dict = field(default_factory=dict)


def parse_junit(text: str) -> list[Row]:
    """pytest's JUnit XML -> one row per test, the figures it recorded (``record_property``)
    beside its duration."""
    rows = []
    for case in ET.fromstring(text).iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        status, detail = "PASS", ""
        for tag, st in (("failure", "FAIL"), ("error", "FAIL"), ("skipped", "SKIP")):
            el = case.find(tag)
            if el is not None:
                status, detail = st, (el.get("message") or "").splitlines()[0][:160] if el.get("message") else ""
                break
        figures: dict = {"seconds": float(case.get("time") or 0)}
        for prop in case.iter("property"):
            figures[prop.get("name", "")] = _figure(prop.get("value", ""))
        rows.append(Row(f"pytest {name}", status, detail, figures))
    return rows


def _figure(value: str):
    """A recorded property's value: a number where it reads as one (JUnit keeps strings)."""
    try:
        return float(value)
    except ValueError:
        return value


def speedups(rows: list[Row]) -> dict[str, float]:
    """Warm p50 of :data:`SPEEDUP_BASE` divided by each target's warm p50 (the rows whose
    figures name a ``target`` and its ``p50_ms``)."""
    p50 = {r.figures["target"]: r.figures["p50_ms"] for r in rows if "target" in r.figures and r.figures.get("p50_ms")}
    base = p50.get(SPEEDUP_BASE)
    return {name: round(base / ms, 2) for name, ms in p50.items()} if base else {}


def render_table(rows: list[Row]) -> str:
    """A fixed-width PASS/FAIL table, failures first in the summary line."""
    width = min(max((len(r.check) for r in rows), default=10), 90)
    lines = [f"{'check':<{width}}  status  detail", f"{'-' * width}  ------  ------"]
    for r in rows:
        lines.append(f"{r.check[:width]:<{width}}  {r.status:<6}  {r.detail}")
    counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "SKIP", "N/A")}
    lines.append(" ".join(f"{k} {v}" for k, v in counts.items()))
    return "\n".join(lines)


def write_report(path: Path, report: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    return path


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------


def _run(cmd: list[str], timeout: int, env: dict | None = None, log: Path | None = None) -> int:
    started = time.monotonic()
    print(f"gpu-check: $ {' '.join(cmd[:6])}{' ...' if len(cmd) > 6 else ''}", flush=True)
    with open(log, "a") if log else open(os.devnull, "w") as out:
        try:
            rc = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    print(f"gpu-check:   exit {rc} after {time.monotonic() - started:.0f} s", flush=True)
    return rc


def prepare_venv(venv: Path, stack: Stack, log: Path) -> str:
    """Create or reuse the venv for ``stack``; returns "" or why it failed."""
    python = venv / "bin" / "python"
    stamp = venv / ".gpu-check-inputs"
    digest = install_inputs_digest(stack)
    if python.exists() and stamp.exists() and stamp.read_text() == digest:
        print(f"gpu-check: reusing {venv} (install inputs unchanged)", flush=True)
        return ""
    if venv.exists():
        shutil.rmtree(venv)
    if _run([sys.executable, "-m", "venv", str(venv)], 120, log=log):
        return f"python -m venv failed (see {log})"
    commands = install_commands(python, stack)
    deadline = time.monotonic() + PHASE_TIMEOUT_S["install"]
    for cmd in commands:
        left = max(int(deadline - time.monotonic()), 1)
        if "--index-url" in cmd:  # torch from PyTorch's CUDA 12 indexes: the first that has it
            for index in stack.torch_indexes:
                cmd[cmd.index("--index-url") + 1] = index
                if _run(cmd, left, log=log) == 0:
                    break
            else:
                return f"torch for CUDA 12 is on none of {list(stack.torch_indexes)} (see {log})"
        elif _run(cmd, left, log=log):
            return f"pip install failed (see {log})"
    stamp.write_text(digest)
    return ""


# Run in the check's venv: the gates' record of the conditions (CPU, GPU clocks,
# temperature, power and memory, load, versions of the GPU stack) and the other processes
# on the GPU.
_CONDITIONS = """
import json, os, shutil, subprocess
from vlad_tools.gates.conditions import capture
cond = capture()
smi = shutil.which("nvidia-smi")
if smi:
    procs = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                           capture_output=True, text=True, check=False)
    cond["other_gpu_processes"] = [p.strip() for p in procs.stdout.splitlines()]
print(json.dumps(cond, default=str))
"""


def venv_conditions(python: Path, env: dict) -> dict:
    """The conditions as the venv's vlad_tools records them; ``{"conditions_error": why}``
    when that fails."""
    try:
        proc = subprocess.run(
            [str(python), "-c", _CONDITIONS],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=PHASE_TIMEOUT_S["conditions"],
            check=False,
        )
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return {"conditions_error": f"{type(exc).__name__}: {exc}"[:200]}


def conditions(gpu: Gpu, stack: Stack) -> dict:
    """The machine the figures were taken on (:func:`venv_conditions` adds clocks,
    temperatures, versions)."""
    return {
        "gpu": gpu.name,
        "driver": gpu.driver,
        "compute_capability": _cc(gpu),
        "memory_mib": gpu.memory_mib,
        "stack": stack.spec,
        "cuda_major": stack.cuda_major,
        "stack_choice": stack.why,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def dry_run() -> str:
    """Run this script's own logic without installing or running anything; returns a
    summary, raises on any broken piece."""
    gpus = parse_nvidia_smi(SAMPLE_SMI)
    assert [g.compute_capability for g in gpus] == [(9, 0), (7, 5)], gpus
    stacks = [choose_stack(g) for g in gpus]
    assert [s.cuda_major for s in stacks] == [13, 12], stacks
    for stack in stacks:
        if problems := exclusivity_problems(ROOT / "pyproject.toml", stack.extras):
            raise AssertionError(f"{stack.spec}: {'; '.join(problems)}")
        cmds = install_commands(Path("/nonexistent/venv/bin/python"), stack)
        assert not any("vlad[" in " ".join(c) and ",cpu" in " ".join(c) for c in cmds), cmds
    rows = parse_junit(SAMPLE_JUNIT) + [Row("pytest (not run)", "N/A", "no GPU")]
    assert [r.status for r in rows] == ["PASS", "PASS", "PASS", "FAIL", "SKIP", "N/A"], rows
    assert speedups(rows) == {SPEEDUP_BASE: 1.0, "tensorrt fp16": 3.0}, speedups(rows)
    render_table(rows)
    with tempfile.TemporaryDirectory() as tmp:
        write_report(Path(tmp) / "report.json", {"rows": [asdict(r) for r in rows]})
    return f"{stacks[0].spec} (CUDA 13) or {stacks[1].spec} (CUDA 12) per driver"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=WORK / "venv", help="the check's own venv (created or reused)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON, logs and engines")
    parser.add_argument("--dry-run", action="store_true", help="only the dry run, even on a GPU machine")
    parser.add_argument("--nvidia-smi", default=None, help=argparse.SUPPRESS)  # tests point it elsewhere
    args = parser.parse_args(argv)

    gpus, why = ([], "dry run requested") if args.dry_run else detect_gpus(args.nvidia_smi)
    if not gpus:
        try:
            summary = dry_run()
        except Exception as exc:  # the dry run exists to catch exactly this
            print(f"gpu-check: no NVIDIA GPU ({why}); dry run FAILED: {type(exc).__name__}: {exc}")
            return 1
        print(f"gpu-check: no NVIDIA GPU ({why}); dry run OK, nothing installed or run: would install {summary}")
        return 0

    started = time.monotonic()
    gpu = gpus[0]
    try:
        stack = choose_stack(gpu)
    except ValueError as exc:
        print(f"gpu-check: {exc}")
        return 1
    out = args.out or WORK / time.strftime("run-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    print(
        f"gpu-check: {gpu.name}, driver {gpu.driver}, cc {_cc(gpu)}: {stack.why}; installing {stack.spec}", flush=True
    )
    if problems := exclusivity_problems(ROOT / "pyproject.toml", stack.extras):
        print(f"gpu-check: {stack.spec} is not coherent: {'; '.join(problems)}")
        return 1
    rows: list[Row] = []
    measured: dict = {}
    if failure := prepare_venv(args.venv, stack, log):
        rows.append(Row("install", "FAIL", failure))
    else:
        rows.append(Row("install", "PASS", stack.spec))
        python = args.venv / "bin" / "python"
        env = {**os.environ, "VLAD_TEST_ENGINE_CACHE": str(out / "engines"), "MUJOCO_GL": "egl"}
        env.pop("VLAD_PLUGINS", None)
        junit = out / "junit.xml"
        rc = _run(
            [str(python), "-m", "pytest", "-m", TEST_SELECTION, "tests/backends", "-q", "-rs"]
            + ["-p", "no:cacheprovider", f"--junitxml={junit}"],
            PHASE_TIMEOUT_S["tests"],
            env=env,
            log=out / "pytest.txt",
        )
        rows += parse_junit(junit.read_text()) if junit.exists() else []
        if rc not in (0, 1) or not junit.exists():
            rows.append(Row("pytest", "FAIL", f"exit {rc} (see {out / 'pytest.txt'})"))
        measured = venv_conditions(python, env)
    report = {
        "conditions": {**conditions(gpu, stack), **measured},
        "rows": [asdict(r) for r in rows],
        "speedups": speedups(rows),
        "seconds": round(time.monotonic() - started, 1),
    }
    path = write_report(out / "gpu-check.json", report)
    print(render_table(rows))
    print(f"gpu-check: {report['seconds']:.0f} s; figures and conditions in {path}")
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
