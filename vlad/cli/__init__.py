"""Command-line entry points: ``vlad`` (the daemon) and ``vladctl`` (operators).

One module per command group: :mod:`~vlad.cli.daemon` (the running daemon),
:mod:`~vlad.cli.release` (keys, signatures, the store), :mod:`~vlad.cli.contract`,
:mod:`~vlad.cli.plan` (the latency planner), :mod:`~vlad.cli.tools` (plugins, export),
:mod:`~vlad.cli.importer` (``vladctl import lerobot``),
:mod:`~vlad.cli.common` (running, exit codes, the operator). Expected failures print one
line ``error: ...`` and exit with an :class:`~vlad.errors.ExitCode`; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys

from vlad import __version__
from vlad.cli.common import run


def vladctl_parser() -> argparse.ArgumentParser:
    from vlad.cli.contract import add_contract_commands
    from vlad.cli.daemon import add_daemon_commands
    from vlad.cli.fleet import add_fleet_commands
    from vlad.cli.importer import add_import_commands
    from vlad.cli.plan import add_plan_commands
    from vlad.cli.release import add_release_commands
    from vlad.cli.tools import add_tool_commands
    from vlad.gates.cli import add_gate_commands

    parser = argparse.ArgumentParser(prog="vladctl", description="Operate vlad: the daemon, releases, contracts.")
    parser.add_argument("--version", action="version", version=f"vladctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_daemon_commands(sub)
    add_release_commands(sub)
    add_fleet_commands(sub)
    add_contract_commands(sub)
    add_plan_commands(sub)
    add_gate_commands(sub)
    add_tool_commands(sub)
    add_import_commands(sub)
    return parser


def vladctl_main(argv: list[str] | None = None) -> int:
    return run(vladctl_parser(), argv)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground (systemd runs exactly this)."""
    from vlad.config import load_config
    from vlad.daemon.supervisor import serve
    from vlad.logs import setup_logging
    from vlad.plugins import monitor_settings

    # The monitors' own tables ([monitors.<name>]) are checked with the rest of the file.
    cfg = load_config(args.config, args.set, monitor_settings())
    setup_logging(cfg.logging.level, cfg.logging.journald)
    return serve(cfg)


def vlad_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlad", description="Serve a VLA policy release.")
    parser.add_argument("--version", action="version", version=f"vlad {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("serve", help="run the daemon (foreground; systemd Type=notify)")
    p.add_argument("--config", default="/etc/vlad/vlad.toml", help="config file (default: %(default)s)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set serve.warmup=5 (repeatable)",
    )
    p.set_defaults(func=cmd_serve)
    return parser


def vlad_main(argv: list[str] | None = None) -> int:
    return run(vlad_parser(), argv)


if __name__ == "__main__":
    sys.exit(vladctl_main())
