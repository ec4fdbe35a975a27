"""``vladctl plan`` (through ``add_plan_commands`` and ``python -m vlad_tools.cli.plan``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from tests.conftest import DEMO, ROOT
from vlad_tools.cli.plan import add_plan_commands, main


def test_wires_into_an_argparse_parser_like_vladctl(capsys):
    parser = argparse.ArgumentParser(prog="vladctl")
    add_plan_commands(parser.add_subparsers())
    args = parser.parse_args(["plan", "--model", "pi0", "--hardware", "rtx-4090", "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["components"]["vision"]["bound"] == "compute" and out["hardware"] == "rtx-4090"
    assert abs(out["compute_ms"] - 31.06) < 0.05 * 31.06


def test_table_for_all_hardware_and_a_detailed_one(capsys):
    assert main(["--model", "pi0"]) == 0
    table = capsys.readouterr().out
    assert "Jetson AGX Thor" in table and "B100" in table and "52.57" in table
    assert (
        main(["--model", "pi0", "--hardware", "b100", "--placement", "edge", "--network", "5g", "--mode", "async"]) == 0
    )
    detail = capsys.readouterr().out
    assert "network up" in detail and "async (sync" in detail and "fits" in detail


def test_contract_feasibility_exit_code(capsys):
    assert main(["--contract", str(DEMO), "--hardware", "jetson-thor"]) == 0
    assert "deadline 20 ms met" in capsys.readouterr().out
    assert (
        main(["--contract", str(DEMO), "--hardware", "b100", "--placement", "cloud", "--network", "4g,slow-cloud"]) == 1
    )
    assert "FLAGGED: predicted e2e" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--hardware", "tpu"], "error: unknown hardware 'tpu'"),
        (["--model", str(ROOT / "nope.toml")], "nope.toml: no such file"),
        (["--placement", "edge", "--hardware", "b100"], "needs a network"),
        (["--plot", "steps"], "--plot needs --out"),
    ],
)
def test_errors_are_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) or message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("kind,suffix", [("steps", ".png"), ("model-size", ".svg"), ("network", ".png")])
def test_plots(tmp_path, capsys, kind, suffix):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"plot{suffix}"
    assert main(["--model", "pi0", "--hardware", "b100,rtx-4090", "--plot", kind, "--out", str(out)]) == 0
    head = out.read_bytes()[:64]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in out.read_bytes()[:2000]


def test_measure_the_demo_release_on_this_machine():
    """Short mode: micro-benchmarks, the release through its backend, each component's
    sub-graph; figures are printed, not asserted (they depend on the machine)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlad_tools.cli.plan",
            "--measure",
            str(DEMO),
            "--keys",
            str(ROOT / "etc" / "vlad" / "keys.d"),
            "--short",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["release"] == "vlad-demo-reacher-1.0.0" and report["precision"] == "fp32"
    assert report["peaks"]["matmul_gflops"]["numpy"] > 0 and report["peaks"]["bandwidth_gb_s"] > 0
    for name in ("vision", "backbone", "action", "e2e"):
        row = report["rows"][name]
        assert row["predicted_ms"] > 0 and row["measured_ms"] > 0 and row["efficiency"] > 0
    assert report["profile"]["boundaries"]["action"]["inputs"][-1] == "noise"


def test_measure_refuses_an_unverifiable_release(tmp_path, capsys):
    assert main(["--measure", str(DEMO), "--keys", str(tmp_path), "--short"]) == 2
    assert "error:" in capsys.readouterr().err
