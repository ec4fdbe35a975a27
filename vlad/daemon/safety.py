"""The stop path: the external e-stop, read on a thread that does nothing else.

vlad never clears or overrides an e-stop; it only reads the state the safety PLC's bridge
publishes (or a file / GPIO value file) and gates the :class:`~vlad.serving.publisher.Publisher`
directly: once :meth:`Publisher.set_estop` returned, no policy chunk leaves, whatever
floods the observation or control sockets and whatever the event loop is doing. The
thread wakes on every e-stop message, every quarter period when an e-stop file is
configured, and when the bridge's silence timeout would expire.

Reading is fail-safe: only a well-formed ``estop`` message whose ``engaged`` is the
boolean ``false`` releases. Anything garbled, of another type, or (with
``safety.require_bridge``) silence longer than ``bridge_timeout_ms`` counts as engaged.
Who may publish on the e-stop endpoint is enforced at connection time
(``safety.estop_producers``, see :mod:`vlad.daemon.sockets`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import zmq

from vlad import protocol
from vlad.config import SafetyConfig
from vlad.files import FileRefused, read_bytes
from vlad.serving.publisher import Publisher
from vlad.threads import Worker

log = logging.getLogger("vlad.safety")

# Messages handled per wake-up: a flood on the e-stop endpoint cannot hold the thread.
BATCH = 32
# The longest a poll blocks when no timer is due (a stop wakes it at once: Worker.wake_fd).
IDLE_WAIT_MS = 1000


class EStop(Worker):
    """The e-stop reader thread (see module docstring)."""

    def __init__(
        self,
        cfg: SafetyConfig,
        sock: zmq.Socket | None,
        publisher: Publisher,
        period_ns: int,
        on_change: Callable[[bool, str], None],
    ) -> None:
        super().__init__("vlad-estop")
        self.cfg = cfg
        self.sock = sock
        self.publisher = publisher
        self.period_ns = period_ns
        self.on_change = on_change
        self.engaged = False
        self.source = ""
        self.reason = ""
        self.last_bridge_ns = 0
        self.counts: Counter[str] = Counter()  # messages, engaged, released, garbled
        self._bridge_engaged = False
        self._file = Path(cfg.estop_file) if cfg.estop_file else None
        self.started_ns = time.monotonic_ns()
        # The bridge's socket and the stop descriptor: a stop ends a poll at once.
        self._poller = zmq.Poller()
        if sock is not None:
            self._poller.register(sock, zmq.POLLIN)
            self._poller.register(self.wake_fd(), zmq.POLLIN)

    def start(self) -> None:
        # The first reading happens before serving starts: a robot booted with the e-stop
        # engaged never publishes a policy chunk, not even one.
        self.poll_once(0)
        super().start()

    def run(self) -> None:
        quarter_ms = max(1, self.period_ns // 4_000_000)
        while not self.stopping:
            timeout_ms = quarter_ms
            try:
                timeout_ms = self._wait_ms(quarter_ms)
                self.poll_once(timeout_ms)
            except Exception:  # a bug here must not end the stop path: treat as engaged
                log.exception("e-stop reading failed: treated as engaged")
                self._set(True, "e-stop reader failed: treated as engaged")
                self.wait(timeout_ms / 1000)

    def _wait_ms(self, quarter_ms: int) -> int:
        """How long the next poll may block. A message wakes it at once; only an e-stop file
        (read every quarter period) and the bridge's silence timeout need a timer. Waking
        200 times a second for nothing would take the GIL from the serving thread as often."""
        if self._file is not None:
            return quarter_ms
        if self.cfg.require_bridge and self.last_bridge_ns:
            left_ns = self.last_bridge_ns + self.cfg.bridge_timeout_ns - time.monotonic_ns()
            if left_ns <= 0:
                return quarter_ms  # already silent (engaged): keep looking, but not in a spin
            return int(min(IDLE_WAIT_MS, left_ns // 1_000_000 + 1))
        if self.cfg.require_bridge:
            return quarter_ms  # engaged until the bridge first speaks; keep looking
        return IDLE_WAIT_MS

    def poll_once(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for bridge messages (or a stop), read them, then judge
        the e-stop."""
        if self.sock is not None:
            if self.sock in dict(self._poller.poll(timeout_ms)):
                for _ in range(BATCH):
                    try:
                        frames = self.sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._message(frames)
        elif timeout_ms:
            self.wait(timeout_ms / 1000)
        engaged, reason = self._bridge_engaged, f"e-stop engaged ({self.source or 'bridge'})"
        cfg = self.cfg
        now = time.monotonic_ns()
        if cfg.require_bridge and now - max(self.last_bridge_ns, self.started_ns) > cfg.bridge_timeout_ns:
            engaged, reason = True, "safety bridge silent: treated as e-stop engaged"
        elif cfg.require_bridge and not self.last_bridge_ns:
            engaged, reason = True, "no word from the safety bridge yet: treated as e-stop engaged"
        if self._file is not None:
            file_engaged, file_reason = self._read_file()
            if file_engaged:
                engaged, reason = True, file_reason
        self._set(engaged, reason)

    def _message(self, frames: list[bytes]) -> None:
        self.counts["messages"] += 1
        try:
            msg = protocol.decode(frames, expect=(protocol.TOPIC_ESTOP,))
            value = msg.header.get("engaged")
            if type(value) is not bool:
                raise protocol.ProtocolError(
                    protocol.Rejection.MALFORMED, f"'engaged' must be true or false, got {value!r:.32}"
                )
            source = msg.header.get("source", "bridge")
            protocol.check_text(source, "source", 128)
        except protocol.ProtocolError as exc:
            # A garbled safety message cannot be read as "released".
            self.counts["garbled"] += 1
            if self.counts["garbled"] <= 10 or self.counts["garbled"] % 1000 == 0:
                log.warning("garbled e-stop message (%d so far), treated as engaged: %s", self.counts["garbled"], exc)
            self._bridge_engaged = True
            self.source = "garbled message"
            return
        self._bridge_engaged = value
        self.source = source
        self.last_bridge_ns = time.monotonic_ns()

    def _read_file(self) -> tuple[bool, str]:
        assert self._file is not None  # called only when an e-stop file is configured
        try:
            text = read_bytes(self._file, 4096).decode("utf-8", "replace").strip().lower()
        except FileNotFoundError:
            return False, ""
        except (FileRefused, OSError):
            return True, f"e-stop file {self._file} unreadable: treated as engaged"
        if text in ("", "0", "released", "false"):
            return False, ""
        if text in ("1", "engaged", "true"):
            return True, f"e-stop engaged ({self._file})"
        return True, f"e-stop file {self._file} holds {text[:32]!r}: treated as engaged"

    def _set(self, engaged: bool, reason: str) -> None:
        if engaged == self.engaged:
            return
        self.publisher.set_estop(engaged)  # the gate first: nothing else may come before it
        self.engaged = engaged
        self.reason = reason if engaged else ""
        self.counts["engaged" if engaged else "released"] += 1
        self.on_change(engaged, reason if engaged else "e-stop released by the safety system")
