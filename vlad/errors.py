"""The exception tree of vlad, and the exit codes of its commands.

Every expected failure is a :class:`VladError`; the command-line tools turn it into one
clear line and an :class:`ExitCode`. Anything else is a bug and keeps its traceback.

    VladError
    ├── ProblemsError (every problem of an input at once)
    │   ├── ContractError, ConfigError, ManifestError, IntegrityError, BadArguments
    ├── TokenizerError, ObservationError (NonFiniteObservation), InputRejected
    ├── ExportError, StartupError, FileRefused, SignatureError, StoreError, ...
    ├── BackendError (BackendUnavailable, RemoteUnavailable)
    └── ClientError (DaemonUnreachable)
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit status of every ``vlad`` / ``vladctl`` command."""

    OK = 0
    FINDINGS = 1  # the command ran and found what it checks for (a breaking diff, a failed gate)
    ERROR = 2  # an expected failure: one line on stderr says what and what to do
    UNREACHABLE = 3  # the daemon did not answer (not running, or another endpoint)
    INTERRUPTED = 130


class VladError(Exception):
    """Base of every expected vlad failure; ``str(exc)`` is the one line a human reads."""


class ProblemsError(VladError):
    """An input with several independent problems, reported all at once.

    ``problems`` lists every problem found, one line each, so that a broken file is fixed
    in one pass instead of one error at a time.
    """

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        if len(self.problems) == 1:
            msg = f"{source}: {self.problems[0]}"
        else:
            msg = f"{source}: {len(self.problems)} problems: " + "; ".join(self.problems)
        super().__init__(msg)


class ContractError(ProblemsError):
    """A release contract is missing, unreadable, incomplete or inconsistent."""


class TokenizerError(VladError):
    """The tokenizer file does not match the contract, or an instruction cannot be encoded."""


class ObservationError(VladError):
    """A raw observation does not match the contract (missing camera, wrong shape or dtype)."""


class NonFiniteObservation(ObservationError):
    """A raw observation holds NaN or Inf values (refused: the contract has no rule to repair them)."""


class InputRejected(VladError):
    """Model inputs were refused before reaching the engine (wrong name, dtype or shape)."""


class ExportError(VladError):
    """Exporting a model failed or the exported artifact does not match the reference."""


class BackendError(VladError):
    """A backend could not load, or failed while running."""


class BackendUnavailable(BackendError):
    """The runtime a backend needs is not usable on this machine (the message says why)."""


class RemoteUnavailable(BackendError):
    """A remote backend could not get an answer in time (server down, refused, late).

    Not the policy's fault: the supervisor falls back without quarantining the policy and
    returns to it once the connection is healthy again."""


class StartupError(VladError):
    """The daemon cannot start (bad release, endpoint in use, backend unusable)."""


class ClientError(VladError):
    """The daemon answered with an error (the message is the daemon's)."""


class DaemonUnreachable(ClientError):
    """The daemon did not answer in time: not running, busy, or another endpoint."""


# The optional packages vlad's tools import, and the extra that installs each (pyproject.toml).
# The on-robot install has none of them; a tool command that needs one says which extra to add.
EXTRA_OF_MODULE = {
    "mcap": "gates",
    "matplotlib": "plot",
    "torch": "torch",
    "torchvision": "lerobot",
    "mujoco": "sim",
    "gymnasium": "sim",
    "onnx": "export",
    "onnxscript": "export",
    "onnxruntime": "cpu",
    "lerobot": "lerobot",
    "kserve": "kserve-server",
    "websockets": "openpi",
    "prometheus_client": "metrics",
    "systemd": "systemd",
}


def missing_extra(exc: BaseException, extra: str | None = None) -> str | None:
    """One line for an import of an optional package that is not installed (which extra
    installs it: ``extra``, else the package's own), or None when ``exc`` is anything else
    (then it is a bug)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".", 1)[0]
    if top not in EXTRA_OF_MODULE:
        return None
    extra = extra or EXTRA_OF_MODULE[top]
    return f"this needs {top}, which is not installed here: pip install 'vlad[{extra}]'"
