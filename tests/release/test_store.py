"""The release store: staging, activation, downgrade rule, rollback and crash consistency."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import NOW, make_keys, make_release
from vlad.cli import release as release_cli
from vlad.release.signing import IntegrityError, ValidityError, verify_release
from vlad.release.store import DowngradeRefused, ReleaseStore, StoreError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def env(tmp_path):
    """(store, {release id: source folder}) with r1 (vc 1), r2 (vc 2) and r0 (vc 0) signed."""
    private, trusted = make_keys(tmp_path)
    sources = {
        rid: make_release(tmp_path / "src" / rid, private, release_id=rid, version_code=vc, payload=rid.encode() * 7)
        for rid, vc in (("r1", 1), ("r2", 2), ("r0", 0))
    }
    return ReleaseStore(tmp_path / "store", trusted), sources


def _same_tree(a: Path, b: Path) -> bool:
    files = lambda root: {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}  # noqa: E731
    return files(a) == files(b)


def test_stage_and_activate(env):
    store, src = env
    assert store.active() is None and store.previous() is None
    assert store.stage(src["r1"], now=NOW) == "r1"
    assert store.stage(src["r1"], now=NOW) == "r1"  # identical again: a no-op
    assert store.list_releases() == ["r1"]
    staged = store.release_path("r1")
    assert _same_tree(staged, src["r1"])
    assert (staged / "policy.onnx").stat().st_mode & 0o777 == 0o444

    e = store.activate("r1", who="ana", why="first install", now=NOW)
    assert (e.event, e.from_release, e.to_release, e.who) == ("activate", None, "r1", "ana")
    assert store.active() == "r1" and store.previous() is None
    # The fixed link the daemon reads resolves to the release folder.
    assert (store.releases_dir / "active").resolve() == staged.resolve()
    verify_release(store.releases_dir / "active", store.keys_dir, NOW)
    with pytest.raises(StoreError, match="already active"):
        store.activate("r1", who="ana", why="again", now=NOW)


def test_stage_refuses_bad_sources(env, tmp_path):
    store, src = env
    (src["r2"] / "policy.onnx").write_bytes(b"r2" * 7 * 10 + b"!")
    with pytest.raises(IntegrityError, match="policy.onnx: size"):
        store.stage(src["r2"], now=NOW)
    with pytest.raises(ValidityError, match="expired"):
        store.stage(src["r1"], now=NOW.replace(year=2040))
    assert store.list_releases() == []
    # Same id, different content: refused, the staged copy is kept.
    store.stage(src["r1"], now=NOW)
    private = next((tmp_path / "private").glob("*.key"))
    other = make_release(tmp_path / "other", private, release_id="r1", payload=b"different")
    with pytest.raises(StoreError, match="already staged with a different manifest"):
        store.stage(other, now=NOW)
    assert _same_tree(store.release_path("r1"), src["r1"])


def _artifact_linked_out(folder: Path, outside: Path) -> None:
    """policy.onnx moved out of the folder (bytes unchanged) and linked back in."""
    shutil.move(folder / "policy.onnx", outside)
    (folder / "policy.onnx").symlink_to(outside)


@pytest.mark.parametrize(
    "damage,problem",
    [
        ("link", "policy.onnx: a symbolic link"),
        ("unlisted", "notes.txt: not listed in the manifest"),
        ("changed", "model_config.json: sha256"),
    ],
)
def test_a_copy_of_a_staged_release_is_judged_like_vladctl_verify_judges_it(env, tmp_path, damage, problem):
    """Offering a copy of a release the store already holds: the staged copy is intact,
    the folder offered is not. The folder offered is refused with what `vladctl verify`
    says of it, and nothing changes in the store."""
    store, src = env
    store.stage(src["r1"], now=NOW)
    offered = tmp_path / "offered"
    shutil.copytree(src["r1"], offered)
    if damage == "link":
        _artifact_linked_out(offered, tmp_path / "outside.onnx")
    elif damage == "unlisted":
        (offered / "notes.txt").write_text("not in the manifest\n")
    else:
        (offered / "model_config.json").write_text('{"width": 9}\n')  # same size, other bytes
    with pytest.raises(IntegrityError) as verified:
        verify_release(offered, store.keys_dir, NOW)
    assert problem in str(verified.value)
    with pytest.raises(IntegrityError) as staged:
        store.stage(offered, now=NOW)
    assert str(staged.value) == str(verified.value)
    assert store.list_releases() == ["r1"] and _same_tree(store.release_path("r1"), src["r1"])
    # The intact folder offered again is the no-op it always was.
    assert store.stage(src["r1"], now=NOW) == "r1"


def test_downgrade_refused_unless_forced(env):
    store, src = env
    for rid in ("r2", "r0"):
        store.stage(src[rid], now=NOW)
    store.activate("r2", who="ana", why="v2", now=NOW)
    with pytest.raises(DowngradeRefused, match=r"r0 \(version_code 0\) is not newer .* \(highest version_code 2\)"):
        store.activate("r0", who="ana", why="try old", now=NOW)
    assert store.active() == "r2"
    e = store.activate("r0", who="ana", why="operator decided", force=True, now=NOW)
    assert e.forced and store.active() == "r0" and store.activated_versions() == {0, 2}
    # Back to v2 (already activated here) needs no force.
    store.activate("r2", who="ana", why="forward again", now=NOW)


def test_one_step_rollback_and_its_reversal(env):
    store, src = env
    for rid in ("r1", "r2"):
        store.stage(src[rid], now=NOW)
        store.activate(rid, who="ana", why=f"install {rid}", now=NOW)
    assert (store.active(), store.previous()) == ("r2", "r1")

    e = store.rollback(who="bo", why="jerky motion")
    assert (e.event, e.from_release, e.to_release) == ("rollback", "r2", "r1")
    assert (store.active(), store.previous()) == ("r1", "r2") and store.bad_releases() == {"r2"}
    # r2 was rolled back from: neither a second rollback nor an activation brings it back...
    with pytest.raises(DowngradeRefused, match="r2 was rolled back from"):
        store.rollback(who="bo", why="undo")
    with pytest.raises(DowngradeRefused, match="rolled back from"):
        store.activate("r2", who="bo", why="retry", now=NOW)
    # ...unless an operator says so.
    store.rollback(who="bo", why="it was the camera, not the model", force=True)
    assert (store.active(), store.previous()) == ("r2", "r1") and store.bad_releases() == {"r1"}
    assert [(h.event, h.to_release) for h in store.history()] == [
        ("activate", "r1"),
        ("activate", "r2"),
        ("rollback", "r1"),
        ("rollback", "r2"),
    ]


def test_rollback_restores_exact_artifacts_and_engine_cache(env):
    store, src = env
    store.stage(src["r1"], now=NOW)
    store.activate("r1", who="ana", why="v1", now=NOW)
    cache = store.engine_cache_dir("r1-onnx-cpu")
    (cache / "model.engine").write_bytes(b"engine for r1")
    store.stage(src["r2"], now=NOW)
    store.activate("r2", who="ana", why="v2", now=NOW)
    store.stage(src["r0"], now=NOW)
    assert store.gc(keep=0) == ["r0"]  # neither active nor previous
    assert set(store.list_releases()) == {"r1", "r2"}

    store.rollback(who="bo", why="regression")
    assert store.active() == "r1"
    assert _same_tree(store.active_path(), src["r1"])
    assert _same_tree(store.releases_dir / "active", src["r1"])
    assert (cache / "model.engine").read_bytes() == b"engine for r1"


def test_nothing_to_roll_back_to(env):
    store, src = env
    with pytest.raises(StoreError, match="nothing to roll back to"):
        store.rollback(who="bo", why="x")
    store.stage(src["r1"], now=NOW)
    store.activate("r1", who="ana", why="v1", now=NOW)
    with pytest.raises(StoreError, match="nothing to roll back to"):
        store.rollback(who="bo", why="x")


# ---- crashes ------------------------------------------------------------------------------------

_CHILD = """
import datetime as dt, sys
sys.path.insert(0, {root!r})
import vlad.release.store
from vlad.release.store import ReleaseStore
store = ReleaseStore({store!r}, {keys!r})
vlad.release.store._CRASH_AT = {point!r}
now = dt.datetime.fromisoformat({now!r})
{action}
print("not killed")
"""


def _run_child(store: ReleaseStore, point: str, action: str) -> subprocess.CompletedProcess:
    code = _CHILD.format(
        root=str(ROOT), store=str(store.root), keys=str(store.keys_dir), point=point, now=NOW.isoformat(), action=action
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def _assert_consistent(store: ReleaseStore, allowed: set[str]) -> str:
    reopened = ReleaseStore(store.root, store.keys_dir)
    active = reopened.active()
    assert active in allowed
    verify_release(reopened.releases_dir / "active", reopened.keys_dir, NOW)
    assert [p.name for p in reopened.releases_dir.iterdir() if p.name.startswith(".")] == []
    assert [p.name for p in reopened.root.glob(".*") if p.name != ".lock"] == [os.readlink(reopened.root / "current")]
    journal = reopened.journal()
    assert journal[-1]["phase"] in ("done", "aborted")  # no dangling intent
    assert reopened.history()[-1].to_release == active  # the journal agrees with the pointers
    return active


@pytest.mark.parametrize(
    "point,expected",
    [
        ("intent_logged", "r1"),
        ("pointer_dir_written", "r1"),
        ("pointer_temp_written", "r1"),
        ("after_rename", "r2"),
        ("done_logged", "r2"),
    ],
)
def test_sigkill_during_activation_leaves_old_or_new(env, point, expected):
    store, src = env
    for rid in ("r1", "r2"):
        store.stage(src[rid], now=NOW)
    store.activate("r1", who="ana", why="v1", now=NOW)
    proc = _run_child(store, point, 'store.activate("r2", who="ci", why="crash test", now=now)')
    assert proc.returncode == -9, proc.stderr
    assert _assert_consistent(store, {"r1", "r2"}) == expected
    reopened = ReleaseStore(store.root, store.keys_dir)
    assert reopened.previous() == ("r1" if expected == "r2" else None)
    if expected == "r1":  # the interrupted activation can simply be run again
        reopened.activate("r2", who="ana", why="retry", now=NOW)
    assert (reopened.active(), reopened.previous()) == ("r2", "r1")


def test_sigkill_during_rollback(env):
    store, src = env
    for rid in ("r1", "r2"):
        store.stage(src[rid], now=NOW)
        store.activate(rid, who="ana", why=rid, now=NOW)
    proc = _run_child(store, "pointer_temp_written", 'store.rollback(who="ci", why="crash test")')
    assert proc.returncode == -9, proc.stderr
    assert _assert_consistent(store, {"r1", "r2"}) == "r2"
    assert ReleaseStore(store.root, store.keys_dir).bad_releases() == set()  # aborted: nothing marked


@pytest.mark.parametrize("point", ["stage_copied", "stage_renamed"])
def test_sigkill_during_stage_never_shows_a_partial_release(env, point):
    store, src = env
    proc = _run_child(store, point, f"store.stage({str(src['r2'])!r}, now=now)")
    assert proc.returncode == -9, proc.stderr
    reopened = ReleaseStore(store.root, store.keys_dir)
    assert [p.name for p in reopened.releases_dir.iterdir()] == (["r2"] if point == "stage_renamed" else [])
    assert reopened.stage(src["r2"], now=NOW) == "r2"
    verify_release(reopened.release_path("r2"), reopened.keys_dir, NOW)


def test_torn_journal_line_is_truncated(env):
    store, src = env
    store.stage(src["r1"], now=NOW)
    store.activate("r1", who="ana", why="v1", now=NOW)
    with open(store.history_path, "a") as f:
        f.write('{"seq": 2, "phase": "inte')
    reopened = ReleaseStore(store.root, store.keys_dir)
    assert store.history_path.read_text().endswith("}\n")
    assert [h.to_release for h in reopened.history()] == ["r1"]


# ---- command line -------------------------------------------------------------------------------


def test_cli_stage_activate_rollback(env, capsys, monkeypatch):
    store, src = env
    # The CLI verifies against the real clock: give the sources a window around today.
    private = next((store.keys_dir.parent / "private").glob("*.key"))
    today = dt.datetime.now(dt.UTC)
    for rid, vc in (("c1", 5), ("c2", 6), ("c0", 4)):
        make_release(
            store.root.parent / "cli" / rid,
            private,
            release_id=rid,
            version_code=vc,
            not_before=today - dt.timedelta(days=1),
            expires=today + dt.timedelta(days=1),
        )
    base = ["--root", str(store.root), "--keys", str(store.keys_dir)]
    monkeypatch.setenv("VLAD_OPERATOR", "tech-7")
    for rid in ("c1", "c2", "c0"):
        assert release_cli.main(["release", "stage", str(store.root.parent / "cli" / rid), *base]) == 0
    assert release_cli.main(["release", "activate", "c1", "--why", "install", *base]) == 0
    assert release_cli.main(["release", "activate", "c2", "--why", "update", *base]) == 0
    capsys.readouterr()
    assert release_cli.main(["release", "activate", "c0", "--why", "old", *base]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: release c0 (version_code 4) is not newer") and err.count("\n") == 1
    assert release_cli.main(["release", "rollback", "--why", "regression", *base]) == 0
    capsys.readouterr()
    assert release_cli.main(["release", "history", "--json", *base]) == 0
    history = json.loads(capsys.readouterr().out)
    assert [(h["event"], h["to_release"], h["who"]) for h in history] == [
        ("activate", "c1", "tech-7"),
        ("activate", "c2", "tech-7"),
        ("rollback", "c1", "tech-7"),
    ]
    assert release_cli.main(["release", "status", "--json", *base]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["active"], status["previous"], status["bad"]) == ("c1", "c2", ["c2"])


# ---- gate evidence: one rule on every way to active ------------------------------------------


@pytest.fixture()
def proofs(tmp_path):
    """(store, sources): "good" with passing evidence, "none" without any, "failed" with a
    failed closed-loop gate; version codes 1, 2, 3."""
    private, trusted = make_keys(tmp_path)
    sources = {
        rid: make_release(tmp_path / "src" / rid, private, release_id=rid, version_code=vc, gate_passed=passed)
        for rid, vc, passed in (("good", 1, True), ("none", 2, None), ("failed", 3, False))
    }
    store = ReleaseStore(tmp_path / "store", trusted)
    for rid in sources:
        store.stage(sources[rid], now=NOW)
    return store, sources


def test_activation_needs_passing_evidence_or_a_recorded_override(proofs):
    from vlad.release.evidence import EvidenceMissing

    store, _ = proofs
    store.activate("good", who="ana", why="first", now=NOW)
    with pytest.raises(EvidenceMissing) as exc:
        store.activate("none", who="ana", why="try", now=NOW)
    text = str(exc.value)
    assert "lacks passing gate evidence (gate closed_loop: no evidence in the manifest)" in text
    assert "vladctl gate" in text and "vladctl release activate none --force --why" in text and "\n" not in text
    with pytest.raises(EvidenceMissing, match="failed its gates .*report eval.json.*--force --why"):
        store.activate("failed", who="ana", why="try", now=NOW)
    with pytest.raises(StoreError, match="--why: must not be empty"):  # forced or not: a reason, recorded
        store.activate("failed", who="ana", why=" ", force=True, now=NOW)
    assert store.active() == "good"

    e = store.activate("failed", who="ana", why="lab trial, arm caged", force=True, now=NOW)
    assert store.active() == "failed" and e.forced and e.evidence == "failed"
    assert e.overrides == ("evidence failed: gate closed_loop (report eval.json): failed",)
    entry = store.history()[-1]  # as the journal recorded it
    assert (entry.evidence, entry.overrides, entry.why) == ("failed", e.overrides, "lab trial, arm caged")
    assert store.history()[0].evidence == "passed" and not store.history()[0].forced


def test_integrity_failures_are_never_overridden(proofs):
    store, _ = proofs
    staged = store.release_path("none") / "policy.onnx"
    os.chmod(staged, 0o644)
    staged.write_bytes(staged.read_bytes()[:-1] + b"!")
    with pytest.raises(IntegrityError, match="policy.onnx: sha256"):
        store.activate("none", who="ana", why="anyway", force=True, now=NOW)
    assert store.active() is None and store.history() == []


def test_rollback_to_a_release_without_evidence_needs_force_and_is_recorded(proofs):
    """A previous release that lacks evidence (e.g. one activated before the rule) is made
    active again only with --force --why, like an activation."""
    from vlad.release.evidence import EvidenceMissing

    store, _ = proofs
    store.activate("none", who="ana", why="before the gates existed", force=True, now=NOW)
    store.activate("failed", who="ana", why="trial", force=True, now=NOW)
    with pytest.raises(EvidenceMissing, match=r"release none lacks .*vladctl rollback --force --why"):
        store.rollback(who="bo", why="regression")
    assert store.active() == "failed"
    e = store.rollback(who="bo", why="regression; none ran fine for months", force=True)
    assert (e.event, e.to_release, e.evidence, e.forced) == ("rollback", "none", "missing", True)
    assert e.overrides[0].startswith("evidence missing: gate closed_loop")


def test_history_and_status_show_the_overrides(proofs, capsys):
    store, _ = proofs
    store.activate("none", who="ana", why="bench test", force=True, now=NOW)
    # A record written before the journal kept evidence (an older vlad) reads as such.
    with open(store.history_path, "a") as f:
        old = {**store.journal()[-1], "seq": 99}
        for key in ("evidence", "evidence_problems", "overrides"):
            old.pop(key)
        f.write(json.dumps({**old, "phase": "intent"}) + "\n" + json.dumps({**old, "phase": "done"}) + "\n")
    base = ["--root", str(store.root), "--keys", str(store.keys_dir)]
    assert release_cli.main(["release", "history", *base]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "by ana: bench test [forced: evidence missing]" in lines[0]
    assert "overrode evidence missing: gate closed_loop: no evidence in the manifest" in lines[1]
    assert lines[2].endswith("[evidence not recorded]")
    assert release_cli.main(["release", "status", "--json", *base]) == 0
    assert json.loads(capsys.readouterr().out)["active_evidence"].startswith("not recorded")


# ---- the operator's text: one rule on every path, printed safely whatever the journal holds ------

# What an operator's --who or --why must not be: terminal escapes, a newline that forges a
# history line carrying the [forced] flag, a bidi override, 100 KB.
FORGED = "ok\n2030-01-11T00:00:00Z  activate good -> failed  by boss: approved [forced: evidence failed]"
BAD_TEXT = {
    "escape": "\x1b[2J\x1b[32mall fine",
    "newline": FORGED,
    "bidi": "fine \u202edesrever",
    "long": "x" * 1025,  # one over the limit (100 KB: the daemon refuses the request's size first)
    "blank": "  ",
}


@pytest.fixture()
def today(tmp_path):
    """proofs' releases valid around today (vladctl verifies against the real clock), staged."""
    private, trusted = make_keys(tmp_path)
    now = dt.datetime.now(dt.UTC)
    window = dict(not_before=now - dt.timedelta(days=1), expires=now + dt.timedelta(days=1))
    store = ReleaseStore(tmp_path / "store", trusted)
    for rid, vc, passed in (("good", 1, True), ("failed", 2, False)):
        store.stage(
            make_release(tmp_path / "src" / rid, private, release_id=rid, version_code=vc, gate_passed=passed, **window)
        )
    return store


def _refused_by_the_daemon(field: str, text: str) -> str:
    """The daemon control server's verdict on a deploy with ``field`` = ``text``."""
    import msgpack

    from vlad.daemon.control import BadArguments, parse_request

    args = {"path": "/srv/release", "who": "ana", "why": "ok", "force": True, field: text}
    with pytest.raises(BadArguments) as exc:
        parse_request(msgpack.packb({"v": 1, "cmd": "deploy", "args": args}))
    assert len(exc.value.problems) == 1
    return exc.value.problems[0]  # "why: <problem>"


@pytest.mark.parametrize("field", ["why", "who"])
@pytest.mark.parametrize("text", BAD_TEXT.values(), ids=list(BAD_TEXT))
def test_offline_activate_and_rollback_refuse_the_text_the_daemon_refuses(today, capsys, field, text):
    """`vladctl release activate --force` and `release rollback` (the store, vlad down) refuse
    exactly what the daemon's deploy refuses, with the same problem, and record nothing."""
    store = today
    problem = _refused_by_the_daemon(field, text)
    base = ["--root", str(store.root), "--keys", str(store.keys_dir)]
    operator = {"who": "ana", "why": "bench trial", field: text}
    for argv in (
        ["release", "activate", "failed", "--force"],
        ["release", "rollback"],  # refused for the text before it finds nothing to roll back to
    ):
        assert release_cli.main([*argv, "--who", operator["who"], "--why", operator["why"], *base]) == 2
        err = capsys.readouterr().err
        assert err == f"error: --{problem}\n", err[:300]
    assert store.active() is None and store.journal() == []


def test_offline_activate_takes_the_text_the_daemon_takes(today, capsys):
    store = today
    why = "ticket 4711: new grasp, caf\u00e9 line \u2192 station 3 " + "z" * 900  # one line, 960 characters
    base = ["--root", str(store.root), "--keys", str(store.keys_dir)]
    assert release_cli.main(["release", "activate", "good", "--who", "t\u00e9ch-7", "--why", why, *base]) == 0
    assert (store.history()[-1].who, store.history()[-1].why) == ("t\u00e9ch-7", why)


def test_history_and_status_print_an_old_journal_safely(proofs, capsys):
    """A journal written before the rule held (escapes, a forged line, 100 KB): `release
    history` and `release status` print one line per record, no control character, text cut
    at 1024 characters; the journal keeps what was written."""
    store, _ = proofs
    store.activate("good", who="ana", why="first", now=NOW)
    store.activate("failed", who="ana", why="placeholder", force=True, now=NOW)
    records = [json.loads(line) for line in store.history_path.read_text().splitlines()]
    hostile = "\x1b[2J\x1b[32m" + FORGED + " " + "y" * 100_000
    for r in records[2:]:
        r.update(who="\u202eana", why=hostile)
    store.history_path.write_text("".join(json.dumps(r) + "\n" for r in records))

    base = ["--root", str(store.root), "--keys", str(store.keys_dir)]
    assert release_cli.main(["release", "history", *base]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3  # the first activation; the forced one and its "overrode" line
    assert all(line.isprintable() for line in lines)
    assert lines[1].startswith(records[3]["time"]) and "by \\u202eana: \\x1b[2J\\x1b[32mok\\x0a2030" in lines[1]
    assert lines[1].endswith("more characters] [forced: evidence failed]") and len(lines[1]) < 1200
    assert release_cli.main(["release", "status", *base]) == 0
    out = capsys.readouterr().out
    assert all(line.isprintable() for line in out.splitlines()) and len(out) < 2000
    entry = store.last_activation("failed")
    assert entry is not None and len(entry.why) == 1024 and entry.why.startswith("\\x1b[2J")
    assert json.loads(store.history_path.read_text().splitlines()[-1])["why"] == hostile  # nothing lost


# ---- each artifact hashed once per operation ---------------------------------------------------


def test_staging_hashes_once_and_hands_the_result_on(env):
    """Stage copies and hashes in one pass; activation with the staging's result hashes
    nothing; a file changed in between is hashed again (and refused)."""
    store, src = env
    lines: list[str] = []
    staged = store.stage_release(src["r1"], now=NOW, progress=lines.append)
    total = sum(a.size for a in staged.manifest.artifacts)
    assert staged.hashed_bytes == total and "GB/s" in staged.hashing and lines[-1] == staged.hashing
    again = verify_release(staged.path, store.keys_dir, NOW, known=staged.files)
    assert again.hashed_bytes == 0 and again.files == staged.files
    assert verify_release(staged.path, store.keys_dir, NOW).hashed_bytes == total  # a new operation: hashed

    e = store.activate(store.admit(staged, "ana", "first", force=False, retry="-"), now=NOW)
    assert e.to_release == "r1"
    store.stage(src["r2"], now=NOW)
    staged2 = store.stage_release(src["r2"], now=NOW)  # already staged: verified (hashed) once more
    admitted = store.admit(staged2, "ana", "second", force=False, retry="-")
    target = store.release_path("r2") / "model_config.json"
    os.chmod(target, 0o644)
    target.write_text('{"width": 9}\n')
    with pytest.raises(IntegrityError, match="model_config.json: s"):  # trusted, but its files' identities checked
        store.activate(admitted, now=NOW)


def test_the_deploy_pipeline_hashes_each_artifact_once(tmp_path):
    """What the daemon's deploy does, step by step, on the demo release: stage (copy and
    hash, evidence judged), load (the staged release taken as it is), activate: one pass in all."""
    from vlad.release.loading import PolicySource, load_policy

    keys = ROOT / "etc" / "vlad" / "keys.d"
    store = ReleaseStore(tmp_path / "store", keys)
    staged = store.stage_release(ROOT / "manifests" / "demo")
    assert staged.hashed_bytes == sum(a.size for a in staged.manifest.artifacts)
    assert staged.evidence.ok
    policy = load_policy(PolicySource(staged.path, str(keys), staged=staged), warmup=1)
    try:
        assert policy.verified is staged.verified and policy.evidence is staged.evidence and policy.staged is staged
        e = store.activate(store.admit(staged, "t", "deploy", force=False, retry="-"))
        assert e.evidence == "passed"
        # A load without the staged release (a daemon start) verifies and hashes: a new operation.
        fresh = load_policy(PolicySource(staged.path, str(keys)), warmup=1)
        assert fresh.verified.hashed_bytes == staged.hashed_bytes
        fresh.session.close()
    finally:
        policy.session.close()
