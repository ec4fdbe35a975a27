"""Command-line entry points: ``vlad`` (the daemon) and ``vladctl`` (operators).

One module per command group: :mod:`~vlad.cli.daemon` (the running daemon),
:mod:`~vlad.cli.release` (keys, signatures, the store), :mod:`~vlad.cli.fleet` (push, pull),
:mod:`~vlad.cli.contract`, :mod:`~vlad.cli.plugins` (what is installed),
:mod:`~vlad.cli.common` (running, exit codes, the operator). Expected failures print one
line ``error: ...`` and exit with an :class:`~vlad.errors.ExitCode`; anything else is a bug
and keeps its traceback.

The workstation's commands (``gate``, ``plan``, ``import``, ...) are not part of the robot
runtime: the ``vlad-tools`` distribution (``tools/``) offers them through the ``vladctl``
entry-point group, each entry point a function that adds its commands to the parser.
Where it is not installed, naming one of them says so in one line.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from typing import Any

from vlad import __version__
from vlad.cli.common import run
from vlad.errors import ExitCode

# The entry-point group through which other distributions add vladctl commands; and the
# commands vlad-tools adds, so that a robot without it answers them with one line.
COMMAND_GROUP = "vladctl"
WORKSTATION_COMMANDS = ("gate", "record", "replay", "evidence", "plan", "import", "export")


def _add_installed_commands(sub: Any) -> None:
    """Add the commands other installed distributions offer (entry-point group ``vladctl``).

    A distribution whose commands do not load is named on stderr and vladctl goes on with the
    rest: an operator's ``status`` or ``rollback`` must not depend on a workstation tool.
    """
    for ep in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        try:
            ep.load()(sub)
        except Exception as exc:  # a broken tool install: say which, keep the operator commands
            dist = ep.dist.name if ep.dist else "?"
            print(
                f"vladctl: warning: commands {ep.name!r} from {dist} did not load: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )


def vladctl_parser() -> tuple[argparse.ArgumentParser, Any]:
    """The parser and its subparsers (whose ``choices`` are the commands installed here)."""
    from vlad.cli.contract import add_contract_commands
    from vlad.cli.daemon import add_daemon_commands
    from vlad.cli.fleet import add_fleet_commands
    from vlad.cli.plugins import add_plugin_commands
    from vlad.cli.release import add_release_commands

    parser = argparse.ArgumentParser(prog="vladctl", description="Operate vlad: the daemon, releases, contracts.")
    parser.add_argument("--version", action="version", version=f"vladctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_daemon_commands(sub)
    add_release_commands(sub)
    add_fleet_commands(sub)
    add_contract_commands(sub)
    add_plugin_commands(sub)
    _add_installed_commands(sub)
    return parser, sub


def vladctl_main(argv: list[str] | None = None) -> int:
    parser, sub = vladctl_parser()
    args = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args if not a.startswith("-")), None)
    if command in WORKSTATION_COMMANDS and command not in sub.choices:
        print(
            f"error: vladctl {command} is a workstation command of vlad-tools, not installed here: "
            "pip install vlad-tools (on a workstation; a robot does not need it)",
            file=sys.stderr,
        )
        return int(ExitCode.ERROR)
    return run(parser, args)


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
