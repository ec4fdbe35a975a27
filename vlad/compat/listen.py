"""``listen = "HOST:PORT"`` or ``"unix:/path"``: parsing and the loopback rule shared by the
openpi endpoint and the metrics endpoint."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class Listen:
    host: str = ""  # empty for unix
    port: int = 0
    path: str = ""  # unix socket path

    @property
    def unix(self) -> bool:
        return bool(self.path)

    def __str__(self) -> str:
        if self.unix:
            return f"unix:{self.path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> Listen:
    """Raises ValueError with a one-line reason."""
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if not path.startswith("/"):
            raise ValueError(f"{text!r}: a unix socket needs an absolute path (unix:/run/vlad/x.sock)")
        return Listen(path=path)
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r}: expected HOST:PORT (e.g. 127.0.0.1:8000) or unix:/path")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"{text!r}: port {port!r} is not a number") from None
    if not 0 < p < 65536:
        raise ValueError(f"{text!r}: port must be 1..65535")
    return Listen(host=host, port=p)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere: not loopback


def listen_problem(text: str, *, remote_ok: bool) -> str | None:
    try:
        listen = parse_listen(text)
    except ValueError as exc:
        return str(exc)
    if not listen.unix and not is_loopback(listen.host) and not remote_ok:
        return f"{text!r} is reachable beyond loopback; refused"
    return None
