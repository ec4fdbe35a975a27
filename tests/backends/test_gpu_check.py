"""scripts/gpu-check without a GPU: the dry run, the stack per driver, the extras (coherent
per CUDA major, cpu and gpu exclusive), the report (rows, recorded figures, speed-ups), and
what its GPU suite measures."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gpu_check = _load("gpu_check")


def test_without_a_gpu_it_says_so_in_one_line_after_a_dry_run(tmp_path):
    """What CI sees: nvidia-smi present but no driver answering (or no nvidia-smi)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n"
    )
    fake.chmod(0o755)
    for smi in (str(fake), str(tmp_path / "absent")):
        proc = subprocess.run(
            [str(SCRIPTS / "gpu-check"), "--nvidia-smi", smi, "--out", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHON": sys.executable},
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("gpu-check: no NVIDIA GPU (") and "dry run OK, nothing installed or run" in lines[0]
        assert "vlad[torch,gpu-cu13,tensorrt-cu13,export]" in lines[0]
    assert not (tmp_path / "out").exists()


def test_nvidia_smi_parsing():
    gpus = gpu_check.parse_nvidia_smi("NVIDIA H200, 580.95.05, 9.0, 143771\nbad line\nOrin, 540.4.0, 8.7, 61440\n")
    assert [(g.name, g.driver_major, g.compute_capability, g.memory_mib) for g in gpus] == [
        ("NVIDIA H200", 580, (9, 0), 143771),
        ("Orin", 540, (8, 7), 61440),
    ]


@pytest.mark.parametrize(
    ("driver", "cc", "cuda"),
    [
        ("580.65.06", (9, 0), 13),
        ("590.1", (12, 0), 13),
        ("580.65.06", (7, 0), 12),
        ("575.51.03", (9, 0), 12),
        ("525.60.13", (8, 6), 12),
    ],
)
def test_stack_follows_the_driver_and_the_gpu(driver, cc, cuda):
    stack = gpu_check.choose_stack(gpu_check.Gpu("gpu", driver, cc, 1))
    assert stack.cuda_major == cuda
    assert stack.extras == ("torch", f"gpu-cu{cuda}", f"tensorrt-cu{cuda}", "export")
    # torch==2.13.0 from PyPI is a CUDA 13 build: the CUDA 12 stack takes PyTorch's cu12x index.
    assert bool(stack.torch_indexes) == (cuda == 12)
    assert gpu_check.NVIDIA_INDEX in stack.extra_indexes  # where TensorRT's libraries come from


def test_too_old_a_driver_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="driver 470.82.01 is older than 525 .* update the NVIDIA driver"):
        gpu_check.choose_stack(gpu_check.Gpu("gpu", "470.82.01", (7, 5), 1))


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_every_extra_is_coherent_and_cpu_gpu_exclusive():
    """No extra pulls both ONNX Runtime wheels or CUDA 12 beside CUDA 13; dev stays CPU."""
    pyproject = ROOT / "pyproject.toml"
    for extra in _extras():
        assert gpu_check.exclusivity_problems(pyproject, (extra,)) == [], extra
    dev = {gpu_check.requirement_name(r) for r in gpu_check.resolve_extras(ROOT / "pyproject.toml", ("dev",))}
    assert "onnxruntime" in dev and "onnxruntime-gpu" not in dev and not any("tensorrt" in n for n in dev)
    assert gpu_check.exclusivity_problems(pyproject, ("dev", "gpu")) == [
        "onnxruntime and onnxruntime-gpu in one environment (the cpu and gpu extras are exclusive)"
    ]
    assert gpu_check.exclusivity_problems(pyproject, ("gpu-cu12", "tensorrt")) == [
        "CUDA [12, 13] wheels in one environment"
    ]


def test_gpu_sets_pin_tensorrt_10_and_matching_cuda_python():
    """tensorrt>=10 resolves to TensorRT 11 (no FP16/BF16 flags): the sets stay on 10."""
    table = _extras()
    for major in (12, 13):
        reqs = gpu_check.resolve_extras(ROOT / "pyproject.toml", (f"tensorrt-cu{major}",))
        trt = next(r for r in reqs if gpu_check.requirement_name(r) == f"tensorrt-cu{major}")
        cuda = next(r for r in reqs if gpu_check.requirement_name(r) == "cuda-python")
        assert "<11" in trt and f"<{major + 1}" in cuda and f">={major}" in cuda
    assert table["gpu"] == ["vlad[gpu-cu13]"] and table["tensorrt"] == ["vlad[tensorrt-cu13]"]
    pins = [r for reqs in table.values() for r in reqs if gpu_check.requirement_name(r) == "torch"]
    assert pins == ["torch==2.13.0"]  # torch is pinned in exactly one place


def test_install_commands_install_one_stack():
    cu12 = gpu_check.choose_stack(gpu_check.Gpu("T4", "535.104.05", (7, 5), 1))
    cmds = gpu_check.install_commands(Path("/venv/bin/python"), cu12)
    flat = [" ".join(c) for c in cmds]
    assert any("torch==2.13.0 --index-url https://download.pytorch.org/whl/cu129" in c for c in flat)
    last = cmds[-1]
    assert f"{ROOT}[torch,gpu-cu12,tensorrt-cu12,export]" in last and "--extra-index-url" in last
    for plugin in ("vlad_tensorrt", "vlad_onnxruntime", "vlad_torch"):
        assert f"-e {ROOT / 'plugins' / plugin}" in flat[-1]
    assert not any("cpu" in c.split("[", 1)[-1].split("]")[0].split(",") for c in flat if "[" in c)


def test_junit_rows_and_table():
    rows = gpu_check.parse_junit(gpu_check.SAMPLE_JUNIT)
    measure = "test_gpu_golden_error_within_the_label_budget_and_warm_latency"
    assert [(r.status, r.check.split("::")[-1]) for r in rows] == [
        ("PASS", "test_gpu_engine_matches_onnxruntime[fp32]"),
        ("PASS", f"{measure}[torch[cuda]-fp32]"),
        ("PASS", f"{measure}[tensorrt-fp16]"),
        ("FAIL", "test_gpu_engine_matches_onnxruntime[fp16]"),
        ("SKIP", "test_gpu_reduced_precisions_are_their_own_labels[bf16]"),
    ]
    assert rows[3].detail == "AssertionError: max abs 0.2 > 0.03"
    assert rows[1].figures == {"seconds": 2.0, "target": "torch[cuda] fp32", "p50_ms": 1.5}  # record_property
    table = gpu_check.render_table(rows)
    assert table.splitlines()[-1] == "PASS 3 FAIL 1 SKIP 1 N/A 0"


def test_speedups_are_over_torch_eager_fp32():
    def row(target, p50):
        return gpu_check.Row("pytest x", "PASS", "", {"target": target, "p50_ms": p50})

    rows = [row("torch[cuda] fp32", 150.0), row("tensorrt fp16", 50.0), gpu_check.Row("install", "PASS")]
    assert gpu_check.speedups(rows) == {"torch[cuda] fp32": 1.0, "tensorrt fp16": 3.0}
    assert gpu_check.speedups(rows[1:]) == {}  # no base measured: no speed-ups


def test_the_gpu_suite_measures_every_gpu_backend_at_each_label():
    """What the GPU suite measures (tests/backends/test_gpu_measures.py), collected here
    without a GPU: every test there skips with its reason."""
    from tests.backends import test_gpu_measures as measures

    names = {f"{v.id} {p}" for v, p in measures.TARGETS}
    for name in (
        "torch[cuda] fp32",
        "torch[cuda] bf16",
        "onnxruntime[cuda] tf32",
        "onnxruntime[tensorrt] tf32",
        "tensorrt fp32",
        "tensorrt fp16",
        "tensorrt bf16",
        "tensorrt tf32",
    ):
        assert name in names
    assert measures.MAX_ABS["fp32"] == 1e-4
