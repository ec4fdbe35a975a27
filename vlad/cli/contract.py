"""``vladctl contract ...``: check, show and diff release contracts.

:func:`add_contract_commands` plugs the commands into any argparse subparsers object;
each sets ``args.func`` to a ``main_contract_*`` function returning the exit code.
Also runnable alone: ``python -m vlad.contract_cli contract diff A B``.

Exit codes: 0 fine (diff: no breaking difference), 1 (diff only) breaking differences,
2 the contract cannot be read or is invalid (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vlad.contract import Contract, FieldDiff, diff_contracts, load_contract
from vlad.errors import ContractError, ExitCode

EXIT_OK = ExitCode.OK
EXIT_BREAKING = ExitCode.FINDINGS
EXIT_ERROR = ExitCode.ERROR


def add_contract_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``contract {check,show,diff}`` to an argparse ``subparsers`` object."""
    contract = subparsers.add_parser("contract", help="check, show or diff release contracts")
    sub = contract.add_subparsers(dest="contract_command", metavar="COMMAND", required=True)

    check = sub.add_parser("check", help="validate a contract, listing every problem")
    check.add_argument("path", help="contract.toml")
    check.set_defaults(func=main_contract_check)

    show = sub.add_parser("show", help="print a validated contract in readable form")
    show.add_argument("path", help="contract.toml")
    show.add_argument("--json", action="store_true", help="print canonical JSON instead")
    show.set_defaults(func=main_contract_show)

    diff = sub.add_parser("diff", help="compare two contracts field by field (exit 1 if any change is breaking)")
    diff.add_argument("old", help="the reference contract.toml")
    diff.add_argument("new", help="the candidate contract.toml")
    diff.add_argument("--json", action="store_true", help="print the differences as JSON")
    diff.set_defaults(func=main_contract_diff)
    return contract


def _fail(exc: ContractError) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return EXIT_ERROR


def main_contract_check(args: argparse.Namespace) -> int:
    """``contract check PATH``: 0 if valid; otherwise every problem on stderr and 2."""
    try:
        contract = load_contract(args.path)
    except ContractError as exc:
        if len(exc.problems) > 1:
            # A list reads better than the one-line form when fixing a file.
            print(f"error: {exc.source}: {len(exc.problems)} problems:", file=sys.stderr)
            for problem in exc.problems:
                print(f"  - {problem}", file=sys.stderr)
            return EXIT_ERROR
        return _fail(exc)
    print(f"{args.path}: ok ({contract.model.id} {contract.model.version}, sha256 {contract.sha256})")
    return EXIT_OK


def main_contract_show(args: argparse.Namespace) -> int:
    """``contract show PATH [--json]``: print the contract; 2 if it is invalid."""
    try:
        contract = load_contract(args.path)
    except ContractError as exc:
        return _fail(exc)
    if getattr(args, "json", False):
        print(json.dumps(contract.to_dict(), indent=2, sort_keys=True))
    else:
        print(format_contract(contract))
    return EXIT_OK


def main_contract_diff(args: argparse.Namespace) -> int:
    """``contract diff OLD NEW [--json]``: 0 no breaking difference, 1 breaking, 2 error."""
    try:
        old = load_contract(args.old)
        new = load_contract(args.new)
    except ContractError as exc:
        return _fail(exc)
    diffs = diff_contracts(old, new)
    n_breaking = sum(d.breaking for d in diffs)
    if getattr(args, "json", False):
        print(
            json.dumps(
                {
                    "old": str(args.old),
                    "new": str(args.new),
                    "differences": len(diffs),
                    "breaking": n_breaking,
                    "diffs": [d.to_dict() for d in diffs],
                },
                indent=2,
            )
        )
    else:
        print(format_diff(diffs, str(args.old), str(args.new)))
    return EXIT_BREAKING if n_breaking else EXIT_OK


# ---- text rendering -------------------------------------------------------------------


def _short(value: Any, limit: int = 48) -> str:
    if value is None:
        return "(absent)"
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _status(d: FieldDiff) -> str:
    if d.breaking:
        return f"BREAKING ({d.category})"
    if d.category == "safety":
        return "review (safety)"
    return f"ok ({d.category})"


def format_diff(diffs: list[FieldDiff], old: str, new: str) -> str:
    """A readable table: path, old → new, BREAKING / review / ok."""
    if not diffs:
        return f"{old} and {new}: identical contracts"
    n_breaking = sum(d.breaking for d in diffs)
    rows = [(d.path, f"{_short(d.old)} → {_short(d.new)}", _status(d)) for d in diffs]
    w0 = max(len("PATH"), *(len(r[0]) for r in rows))
    w1 = max(len("OLD → NEW"), *(len(r[1]) for r in rows))
    lines = [
        f"{old} → {new}: {len(diffs)} difference(s), {n_breaking} breaking",
        f"{'PATH':<{w0}}  {'OLD → NEW':<{w1}}  STATUS",
    ]
    lines += [f"{p:<{w0}}  {c:<{w1}}  {s}" for p, c, s in rows]
    return "\n".join(lines)


def format_contract(c: Contract) -> str:
    """A human summary of a contract, one block per section."""
    out = [
        f"contract  {c.path or '<memory>'}  ({c.format}, sha256 {c.sha256})",
        f"model     {c.model.id} {c.model.version} [{c.model.family}]",
    ]
    for cam in c.cameras:
        r, m = cam.raw, cam.model
        out.append(
            f"camera    {cam.name} -> {cam.input}: raw {r.height}x{r.width} {r.color_order} "
            f"{r.layout} {r.dtype} -> model {m.height}x{m.width} {m.color_order} {m.layout} "
            f"{m.dtype} (resize {m.resize}, crop {m.crop}, /{m.scale:g}, mean {list(m.mean)}, "
            f"std {list(m.std)})"
        )
    if c.language:
        lg = c.language
        out.append(
            f"language  -> {lg.input}: {lg.tokenizer} ({lg.library} {lg.library_version}, "
            f"{lg.file} sha256 {lg.sha256[:12]}…), max {lg.max_tokens} tokens, pad "
            f"{lg.padding_side} id {lg.pad_id}, truncation {lg.truncation}"
        )
    if c.proprio:
        p = c.proprio
        entries = ", ".join(f"{n} [{u}]" for n, u in zip(p.names, p.units, strict=True))
        out.append(f"proprio   -> {p.input}: dim {p.dim}, frame {p.frame}: {entries}")
    if c.noise:
        n = c.noise
        out.append(
            f"noise     -> {n.input}: {list(n.shape)} {n.dtype}, {n.seeding} seed {n.seed}, "
            f"{n.denoising_steps} denoising steps"
        )
    a = c.action
    out.append(
        f"action    <- {a.output}: chunk {a.chunk_length} x dim {a.dim}, frame {a.frame}, "
        f"scale {a.scale:g}, nonfinite {a.on_nonfinite}, bounds {a.on_bound_violation}, "
        f"hold {a.hold_posture}"
    )
    for j in a.joints:
        out.append(
            f"  joint   {j.name}: {j.semantics} [{j.unit}] mean {j.mean:g} std {j.std:g} "
            f"bounds [{j.lower:g}, {j.upper:g}] rate {j.rate_limit:g}/period"
        )
    t = c.timing
    out.append(
        f"timing    period {t.control_period_ms:g} ms, max obs age {t.max_observation_age_ms:g} ms, "
        f"validity {t.action_validity_ms:g} ms, deadline {t.e2e_deadline_ms:g} ms"
    )
    for kind, tensors in (("input", c.inputs), ("output", c.outputs)):
        for ts in tensors:
            out.append(
                f"{kind:<9} {ts.name}: {ts.dtype} {ts.layout} min {list(ts.min_shape)} "
                f"opt {list(ts.opt_shape)} max {list(ts.max_shape)}"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m vlad.contract_cli contract ...``."""
    parser = argparse.ArgumentParser(prog="vlad-contract")
    add_contract_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
