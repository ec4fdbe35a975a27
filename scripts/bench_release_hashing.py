#!/usr/bin/env python3
"""How long staging, verifying and activating a large release take, and how much is hashed.

Builds a signed release with one artifact of ``--gb`` GB of random bytes (plus the demo's
contract and tokenizer) in a temporary folder, then measures on this machine:

* ``sha256`` of the artifact alone (the rate every step below is bounded by);
* ``stage``: copy into a store and hash in the same pass (``ReleaseStore.stage_release``);
* ``activate`` with the staging's result handed on (identities compared, nothing hashed);
* ``verify`` afresh, as another operation (a daemon start, ``vladctl verify``) does;

and prints each with the bytes it hashed and its rate, with the conditions (CPU, cores,
load, free memory, the file system, whether the file was in the page cache). The deploy
path hashed the artifact four times before (stage: source and copy; load; activate): the
last line puts the measured single pass beside that.

    .venv/bin/python scripts/bench_release_hashing.py --gb 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from vlad_tools.testing.conditions import conditions as shared_conditions

ROOT = Path(__file__).resolve().parent.parent


def conditions(folder: Path) -> str:
    c = shared_conditions()
    fs = next((ln.split()[2] for ln in open("/proc/mounts") if ln.split()[1] == "/"), "?")
    return (
        f"{c['date']}, {c['cpu']}, {c['cpus']} cores, load {c['load_avg']}, "
        f"{c['memory_available_gb']} GB available, root file system {fs} ({folder})"
    )


def write_random(path: Path, size: int) -> None:
    block = os.urandom(16 << 20)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=2.0, help="artifact size in GB (10^9 bytes)")
    p.add_argument("--dir", default=None, help="work folder (default: a temporary one); needs 2x the size free")
    args = p.parse_args(argv)

    from vlad.release.authoring import new_manifest_data, write_manifest
    from vlad.release.signing import sign_release, verify_release
    from vlad.release.store import ReleaseStore

    size = int(args.gb * 1e9)
    work = Path(tempfile.mkdtemp(prefix="vlad-hash-bench-", dir=args.dir))
    try:
        src = work / "src"
        src.mkdir()
        for name in ("contract.toml", "tokenizer.json", "eval.json"):
            shutil.copy(ROOT / "manifests" / "demo" / name, src / name)
        write_random(src / "policy.onnx", size)
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        data = new_manifest_data(
            src,
            release_id="bench-large-1.0.0",
            version="1.0.0",
            version_code=1,
            backend="onnxruntime",
            artifact="policy.onnx",
            not_before=now - dt.timedelta(days=1),
            expires=now + dt.timedelta(days=1),
            gates=[{"gate": "closed_loop", "report": "eval.json", "passed": True}],
        )
        data["gate_plan"] = {"required": ["closed_loop"]}
        write_manifest(src, data)
        keys = ROOT / "etc" / "vlad" / "keys.d"
        sign_release(src, ROOT / "etc" / "vlad" / "demo-signing-key.pem")
        print(f"conditions: {conditions(work)}")
        print(f"release: one artifact of {size / 1e9:.2f} GB (random bytes), written just before: in the page cache")

        t0 = time.perf_counter()
        h = hashlib.sha256()
        with open(src / "policy.onnx", "rb") as f:
            while block := f.read(4 << 20):
                h.update(block)
        t_hash = time.perf_counter() - t0
        print(f"sha256 alone:                 {t_hash:6.2f} s  {size / t_hash / 1e9:5.2f} GB/s")

        store = ReleaseStore(work / "store", keys)
        lines: list[str] = []
        t0 = time.perf_counter()
        staged = store.stage_release(src, progress=lines.append)
        t_stage = time.perf_counter() - t0
        print(
            f"stage (copy + hash, fsync):   {t_stage:6.2f} s  hashed {staged.hashed_bytes / 1e9:5.2f} GB "
            f"({staged.hashed_bytes / t_stage / 1e9:.2f} GB/s); progress lines: {len(lines)}"
        )
        t0 = time.perf_counter()
        store.activate(store.admit(staged, "bench", "bench", force=False, retry="-"))
        t_act = time.perf_counter() - t0
        again = verify_release(staged.path, keys, known=staged.files)
        print(f"activate (result handed on): {t_act:6.2f} s  hashed {again.hashed_bytes / 1e9:5.2f} GB")
        t0 = time.perf_counter()
        fresh = verify_release(staged.path, keys)
        t_verify = time.perf_counter() - t0
        print(
            f"verify afresh (new operation): {t_verify:5.2f} s  hashed {fresh.hashed_bytes / 1e9:5.2f} GB "
            f"({fresh.hashed_bytes / t_verify / 1e9:.2f} GB/s)"
        )
        once = t_stage + t_act
        print(
            f"stage + activate: {once:.2f} s hashing once; four passes (the deploy path before: stage source "
            f"and copy, load, activate) would add about {3 * t_hash:.1f} s of hashing at the rate above"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
