"""What every ``vlad`` / ``vladctl`` command shares: running, exit codes, the operator, the daemon.

:func:`run` turns an expected failure (:class:`~vlad.errors.VladError`) into one line
``error: ...`` on stderr and its :class:`~vlad.errors.ExitCode`; anything else is a bug and
keeps its traceback. A reader that stops early (``vladctl events | head``) ends the
command quietly, as the shell expects (exit 141, SIGPIPE's). :func:`operator` is the one rule for who is acting, :func:`request`
the one way to ask the running daemon.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from vlad.errors import DaemonUnreachable, ExitCode, VladError, missing_extra

DEFAULT_CONFIG = "/etc/vlad/vlad.toml"


def run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return ExitCode.ERROR
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()  # a reader gone early shows here, not as a traceback at exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to write
        return 128 + 13  # as if killed by SIGPIPE, what `cmd | head` shells expect
    except DaemonUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.UNREACHABLE
    except VladError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except ModuleNotFoundError as exc:
        if (line := missing_extra(exc)) is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def operator(explicit: str | None = None) -> str:
    """Who is acting: ``--who``, else ``$VLAD_OPERATOR``, ``$SUDO_USER``, the login name."""
    from vlad.release.store import default_operator

    return explicit or default_operator()


def add_operator_args(
    p: argparse.ArgumentParser, why: str = "reason, recorded in the history", force: str = ""
) -> None:
    """``--why`` (required; ``why`` is its help), ``--who`` (:func:`operator`) and, where
    the command can be forced, ``--force`` with ``force`` saying what it allows."""
    p.add_argument("--why", required=True, help=why)
    p.add_argument("--who", help="operator name (default: $VLAD_OPERATOR, $SUDO_USER, the login name)")
    if force:
        p.add_argument("--force", action="store_true", help=force)


def load_config_or_defaults(path: str | None) -> Any:
    """The daemon config for a command that needs an endpoint or the store root; the
    default path may be absent (a development machine): then the defaults."""
    from pathlib import Path

    from vlad.config import load_config

    if path is None or (path == DEFAULT_CONFIG and not Path(path).exists()):
        return load_config(None)
    return load_config(path)


def add_daemon_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=DEFAULT_CONFIG, help="daemon config, for the control endpoint")
    p.add_argument("--endpoint", help="control endpoint (overrides the config)")
    p.add_argument("--timeout-ms", type=int, default=2000)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--curve-key", help="CurveZMQ: this client's secret key file (tcp:// control)")
    p.add_argument("--curve-server-key", help="CurveZMQ: the daemon's public key file (tcp:// control)")


def request(args: argparse.Namespace, cmd: str, timeout_ms: int | None = None, **kw: Any) -> Any:
    """One control request to the running daemon (:class:`DaemonUnreachable` if it is not)."""
    import zmq

    from vlad.client import control_request, load_curve

    endpoint = args.endpoint or load_config_or_defaults(args.config).sockets.control
    curve = load_curve((args.curve_key, args.curve_server_key)) if args.curve_key else None
    return control_request(zmq.Context.instance(), endpoint, cmd, timeout_ms or args.timeout_ms, curve=curve, **kw)


def keys_dir(args: argparse.Namespace) -> str:
    """The trusted keys: ``--keys``, else ``$VLAD_KEYS_DIR``, else the config's ``release.keys_dir``."""
    import os

    from vlad.release.signing import DEFAULT_KEYS_DIR

    cfg = load_config_or_defaults(getattr(args, "config", None))
    return (
        getattr(args, "keys", None) or os.environ.get("VLAD_KEYS_DIR") or cfg.release.keys_dir or str(DEFAULT_KEYS_DIR)
    )


def store(args: argparse.Namespace, create: bool = False) -> Any:
    """The release store: ``--root``, else the config's ``store.root`` (one source)."""
    from vlad.release.store import ReleaseStore

    cfg = load_config_or_defaults(getattr(args, "config", None))
    root = getattr(args, "root", None) or cfg.store.root
    return ReleaseStore(root, keys_dir(args), create=create, lock_timeout_s=cfg.store.lock_timeout_s)
