"""The gate commands: wiring into any argparse parser, one-line errors, record and replay."""

from __future__ import annotations

import argparse

import pytest

from tests.gates import candidates
from tests.gates.conftest import RECORDING
from vlad.cli import vladctl_main as main
from vlad_tools.gates.cli import add_gate_commands


def test_commands_plug_into_a_parser_and_set_func():
    parser = argparse.ArgumentParser(prog="vladctl")
    add_gate_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["gate", "cand", "--baseline", "base", "--report", "out", "--all", "--episodes", "3"])
    assert args.func.__name__ == "cmd_gate" and args.all and args.episodes == 3
    for argv, name in (
        (["record", "--out", "x.mcap"], "cmd_record"),
        (["replay", "x.mcap", "--release", "r"], "cmd_replay"),
        (["evidence", "r"], "cmd_evidence"),
    ):
        assert parser.parse_args(argv).func.__name__ == name


def test_expected_failures_are_one_line(tmp_path, capsys):
    assert main(["gate", str(tmp_path / "nope"), "--baseline", str(candidates.DEMO), "--report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and "no such release folder" in err
    assert main(["replay", str(tmp_path / "none.mcap"), "--release", str(candidates.DEMO)]) == 2
    assert "no such recording" in capsys.readouterr().err
    plan = tmp_path / "bad.toml"
    plan.write_text('[performance]\nwarm_calls = "many"\n')
    assert (
        main(
            [
                "gate",
                str(candidates.DEMO),
                "--baseline",
                str(candidates.DEMO),
                "--report",
                str(tmp_path / "r"),
                "--plan",
                str(plan),
            ]
        )
        == 2
    )
    assert "performance.warm_calls: expected an integer, got a string" in capsys.readouterr().err


def test_evidence_command_and_deploy_enforcement_on_the_demo(capsys):
    from vlad.release.manifest import read_manifest_document
    from vlad_tools.gates.evidence import EvidenceMissing, enforce_evidence

    # The demo ships its own signed evidence for all four gates.
    assert main(["evidence", str(candidates.DEMO)]) == 0
    capsys.readouterr()
    # The same release with only its closed-loop verdict: deploy must refuse it as it is.
    doc = dict(read_manifest_document(candidates.DEMO))
    doc["gates"] = [g for g in doc["gates"] if g["gate"] == "closed_loop"]
    with pytest.raises(EvidenceMissing, match=r"lacks passing gate evidence \(gate contract: no evidence") as exc:
        enforce_evidence(doc, candidates.DEMO)
    assert "--force --why" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(EvidenceMissing, match="--force needs --why"):
        enforce_evidence(doc, candidates.DEMO, force=True, why="  ")
    decision = enforce_evidence(doc, candidates.DEMO, force=True, why="bench test, arm unpowered")
    assert decision["forced"] and decision["why"] == "bench test, arm unpowered" and len(decision["problems"]) == 3


def test_required_gates_come_from_the_manifest_plan(tmp_path):
    from vlad.release.manifest import read_manifest_document
    from vlad_tools.gates.evidence import check_evidence, required_gates

    doc = dict(read_manifest_document(candidates.DEMO))
    assert required_gates(doc) == ["contract", "equivalence", "performance", "closed_loop"]
    doc["gate_plan"] = {"required": ["closed_loop"]}
    assert check_evidence(doc, candidates.DEMO) == []  # the gate report, listed with its hash, passed


def test_replay_command_on_the_fixture(capsys):
    assert (
        main(
            [
                "replay",
                str(RECORDING),
                "--release",
                str(candidates.DEMO),
                "--baseline",
                str(candidates.DEMO),
                "--limit",
                "20",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "replayed 20 observations" in out and "max abs per joint [0, 0]" in out


def test_record_command_stops_at_its_time_limit(tmp_path, capsys):
    from vlad_tools.gates.recording import read_recording

    out = tmp_path / "short.mcap"
    argv = ["record", "--out", str(out), "--demo", str(candidates.DEMO), "--episodes", "3", "--seconds", "0.5"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "stopped: time limit (0.5 s) reached" in text
    rec = read_recording(out)
    assert 0 < len(rec.observations) <= 30 and rec.metadata["vlad.recording"]["tap"] == "controller"
