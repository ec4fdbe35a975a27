"""``vlad serve``: the supervisor that owns the sockets, the worker and every task.

Lifecycle (uvicorn-style): :meth:`Daemon.startup` loads and warms the release and binds
the sockets, then ``READY=1``; :meth:`Daemon.main_loop` runs the named tasks in one task
group (observation intake, control, status, watchdog, signals); :meth:`Daemon.shutdown`
stops intake, lets the in-flight inference finish within a bound, publishes a final
status and closes the sockets with linger. A second SIGTERM/SIGINT forces the exit.

The hot path itself lives in :mod:`vlad.serving`.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import signal
import socket
import stat
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import zmq
import zmq.asyncio

from vlad import __version__, protocol
from vlad.config import Config
from vlad.contract import Contract, load_contract
from vlad.errors import VladError
from vlad.processing import Tokenizer
from vlad.serving import Pending, PolicyWorker, observation_from_message
from vlad.state import State, StateMachine
from vlad.systemd import Notifier
from vlad.systemd import context as log_context
from vlad.tracing import LatencyStats

log = logging.getLogger("vlad.daemon")


class StartupError(VladError):
    """The daemon cannot start (bad release, endpoint in use, backend unusable)."""


# ---------------------------------------------------------------------------------------
# Endpoints
# ---------------------------------------------------------------------------------------


def prepare_ipc(endpoint: str, group: str) -> None:
    """Make an ``ipc://`` endpoint bindable, refusing one another process is serving.

    ZeroMQ silently steals an ipc path that is already bound, so probe it first: a live
    listener answers a connect (in use: refuse); a leftover file refuses it (stale:
    remove). The folder is created ``0770`` and handed to ``group`` when it exists, so
    directory permissions are the access control.
    """
    if not endpoint.startswith("ipc://"):
        return
    path = Path(endpoint[len("ipc://") :])
    folder = path.parent
    if not folder.exists():
        try:
            folder.mkdir(mode=0o770, parents=True)
        except OSError as exc:
            raise StartupError(f"cannot create {folder} for {endpoint}: {exc.strerror}") from None
        try:
            os.chown(folder, -1, grp.getgrnam(group).gr_gid)
        except (KeyError, PermissionError):
            pass  # no such group on this machine, or not ours to give: keep the owner's
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(0.5)
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StartupError(f"endpoint {endpoint}: cannot probe {path}: {exc.strerror}") from None
        else:
            raise StartupError(f"endpoint {endpoint} is in use by another process (is another vlad running?)")
        finally:
            probe.close()


def bind(sock: zmq.Socket, endpoint: str, group: str) -> None:
    prepare_ipc(endpoint, group)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(f"endpoint {endpoint} is already in use") from None
        raise StartupError(f"cannot bind {endpoint}: {exc.strerror}") from None
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IWGRP)


# ---------------------------------------------------------------------------------------
# The release being served
# ---------------------------------------------------------------------------------------


def load_release(cfg: Config):
    """Contract, tokenizer and a loaded backend session for ``cfg.release``."""
    from vlad.plugins import get_backend

    folder = Path(cfg.release.path)
    contract_path = folder / "contract.toml"
    if not contract_path.is_file():
        raise StartupError(f"release {folder}: no contract.toml (is release.path right?)")
    contract: Contract = load_contract(contract_path)
    tokenizer = Tokenizer.from_contract(contract) if contract.language else None
    artifact = folder / cfg.release.artifact
    if not artifact.is_file():
        raise StartupError(f"release {folder}: artifact {cfg.release.artifact} is missing")
    backend = get_backend(cfg.release.backend)
    avail = backend.availability()
    if not avail.usable:
        raise StartupError(f"backend {backend.name} is not usable here: {avail.reason}")
    session = backend.load(artifact, contract, cfg.release.options)
    return contract, tokenizer, session


# ---------------------------------------------------------------------------------------
# The supervisor
# ---------------------------------------------------------------------------------------


class Daemon:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.state = StateMachine()
        self.notifier = Notifier()
        self.stats = LatencyStats(cfg.serve.latency_window)
        self.counters: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.started_ns = time.monotonic_ns()
        self.last_heartbeat_ns = 0
        self.status_seq = 0
        self.stopping = False
        self._rates_prev: tuple[int, int, int] = (time.monotonic_ns(), 0, 0)
        self.rates = {"observations_hz": 0.0, "actions_hz": 0.0}
        self.worker: PolicyWorker | None = None
        self._signals = 0

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> int:
        async with AsyncExitStack() as stack:
            await self.startup(stack)
            await self.main_loop()
        return 0

    async def startup(self, stack: AsyncExitStack) -> None:
        cfg = self.cfg
        s = cfg.sockets
        # Refuse an endpoint another process serves before spending seconds on loading.
        for endpoint in (s.observations, s.actions, s.status, s.control):
            prepare_ipc(endpoint, s.ipc_group)
        self.notifier.status("loading release")
        # Loading and warming up take seconds: off the event loop.
        contract, tokenizer, session = await anyio.to_thread.run_sync(load_release, cfg)
        stack.callback(session.close)
        self.contract, self.session = contract, session
        self.release_id = f"{contract.model.id}@{contract.model.version}"
        log_context.release = self.release_id
        self.backend_description = session.describe()
        self.notifier.status(f"warming up {self.release_id}")
        t0 = time.monotonic()
        await anyio.to_thread.run_sync(session.warmup, cfg.serve.warmup)
        log.info("loaded %s on %s, %d warm-up inferences in %.2f s", self.release_id,
                 self.backend_description.backend, cfg.serve.warmup, time.monotonic() - t0)

        ctx = zmq.Context()
        stack.callback(ctx.term)
        actx = zmq.asyncio.Context.shadow(ctx.underlying)
        linger = s.linger_ms

        def make(kind: int, async_: bool = True):
            sock = (actx if async_ else ctx).socket(kind)
            sock.setsockopt(zmq.LINGER, linger)
            stack.callback(sock.close, linger)
            return sock

        self.obs_sock = make(zmq.SUB)
        self.obs_sock.setsockopt(zmq.RCVHWM, cfg.serve.observation_hwm)
        for topic in (protocol.TOPIC_OBS, protocol.TOPIC_HEARTBEAT):
            self.obs_sock.setsockopt(zmq.SUBSCRIBE, topic)
        actions_sock = make(zmq.PUB, async_=False)  # owned by the worker thread
        actions_sock.setsockopt(zmq.SNDHWM, 16)
        self.status_sock = make(zmq.PUB)
        self.control_sock = make(zmq.REP)
        for sock, endpoint in (
            (self.obs_sock, s.observations),
            (actions_sock, s.actions),
            (self.status_sock, s.status),
            (self.control_sock, s.control),
        ):
            bind(sock, endpoint, s.ipc_group)
            if endpoint.startswith("ipc://"):
                stack.callback(Path(endpoint[len("ipc://") :]).unlink, missing_ok=True)

        self.worker = PolicyWorker(
            contract=contract,
            tokenizer=tokenizer,
            session=session,
            release_id=self.release_id,
            actions_socket=actions_sock,
            stats=self.stats,
            state_name=lambda: self.state.state.value,
        )
        self.worker.start()
        stack.push_async_callback(self.shutdown)
        self.state.transition(State.ACTIVE, "release loaded and warmed up", release=self.release_id)
        self.notifier.ready(f"serving {self.release_id} on {self.backend_description.backend}")

    async def main_loop(self) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._signals_task, name="signals")
            tg.start_soon(self._intake_task, name="intake")
            tg.start_soon(self._control_task, name="control")
            tg.start_soon(self._status_task, name="status")
            tg.start_soon(self._watchdog_task, name="watchdog")

    async def shutdown(self) -> None:
        """Stop intake, finish or abandon the in-flight inference, final status, close."""
        with anyio.CancelScope(shield=True):
            if self.state.state != State.STOPPING:
                self.state.transition(State.STOPPING, "shutdown requested")
            self.notifier.stopping("stopping: finishing in-flight inference")
            self.stopping = True
            if self.worker is not None:
                finished = await anyio.to_thread.run_sync(self.worker.stop, self.cfg.serve.shutdown_timeout_s)
                if not finished:
                    log.warning("in-flight inference did not finish within %.1f s; abandoned", self.cfg.serve.shutdown_timeout_s)
            try:
                await self._publish_status()
            except zmq.ZMQError:
                pass
            log.info("stopped")

    # -- tasks -----------------------------------------------------------------------------

    async def _signals_task(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self._signals += 1
                if self._signals > 1:
                    log.warning("second %s: forcing exit", signal.Signals(signum).name)
                    os._exit(1)
                log.info("%s received: shutting down", signal.Signals(signum).name)
                self.state.transition(State.STOPPING, f"{signal.Signals(signum).name} received")
                self.stopping = True
                self._tg.cancel_scope.cancel()
                # Keep listening so that a second signal still forces the exit while the
                # shutdown (outside this task group) is running.
                self._second_signal_guard()

    def _second_signal_guard(self) -> None:
        def force(signum, _frame):
            os._exit(1)

        signal.signal(signal.SIGTERM, force)
        signal.signal(signal.SIGINT, force)

    async def _intake_task(self) -> None:
        contract = self.contract
        worker = self.worker
        while True:
            frames = await self.obs_sock.recv_multipart()
            receive_ns = time.monotonic_ns()
            try:
                msg = protocol.decode(frames, expect=(protocol.TOPIC_OBS, protocol.TOPIC_HEARTBEAT))
                if msg.topic == protocol.TOPIC_HEARTBEAT:
                    self.last_heartbeat_ns = receive_ns
                    self.counters["heartbeats"] += 1
                    continue
                obs = observation_from_message(contract, msg)
            except protocol.ProtocolError as exc:
                self._reject(exc)
                continue
            self.counters["observations"] += 1
            worker.slot.put(Pending(obs, receive_ns))

    def _reject(self, exc: protocol.ProtocolError) -> None:
        self.rejected[exc.reason] += 1
        n = sum(self.rejected.values())
        # Loud for the first ones, then sampled, so a broken client cannot flood the journal.
        if n <= 10 or n % 1000 == 0:
            log.warning("rejected message (%d so far): %s", n, exc)

    async def _control_task(self) -> None:
        while True:
            frame = await self.control_sock.recv()
            try:
                cmd, args = protocol.decode_request(frame)
                result = self.handle_control(cmd, args)
                reply = protocol.encode_reply(True, result)
            except protocol.ProtocolError as exc:
                self.rejected[exc.reason] += 1
                reply = protocol.encode_reply(False, error=str(exc))
            except VladError as exc:
                reply = protocol.encode_reply(False, error=str(exc))
            await self.control_sock.send(reply)

    def handle_control(self, cmd: str, args: dict[str, Any]) -> Any:
        if cmd == "ping":
            return {"pong": True, "pid": os.getpid(), "version": __version__}
        if cmd == "status":
            return self.status()
        if cmd == "events":
            limit = int(args.get("limit", 100))
            return [e.to_dict() for e in list(self.state.events)[-limit:]]
        raise VladError(f"unknown control command {cmd!r} (known: ping, status, events)")

    async def _status_task(self) -> None:
        period = 1.0 / self.cfg.serve.status_hz
        while True:
            await self._publish_status()
            await anyio.sleep(period)

    async def _publish_status(self) -> None:
        st = self.status()
        self.status_seq += 1
        await self.status_sock.send_multipart(protocol.encode(protocol.TOPIC_STATUS, {"seq": self.status_seq, "status": st}))
        e2e = st["latency_ms"].get("e2e")
        p99 = f", e2e p99 {e2e['p99']:.2f} ms" if e2e else ""
        self.notifier.status(f"{st['state']} {self.release_id}, {st['rates']['actions_hz']:.1f} actions/s{p99}")

    async def _watchdog_task(self) -> None:
        usec = self.notifier.watchdog_usec
        if not usec:
            await anyio.sleep_forever()
        interval = usec / 2e6
        warned = False
        while True:
            # This task runs on the event loop, so a dead loop stops the pings by itself;
            # the worker check catches a hung engine or a dead inference thread.
            if self.making_progress():
                self.notifier.watchdog()
                warned = False
            elif not warned:
                log.error("control loop not making progress: withholding the systemd watchdog ping")
                warned = True
            await anyio.sleep(interval)

    def making_progress(self) -> bool:
        w = self.worker
        if w is None or not w.alive:
            return False
        now = time.monotonic_ns()
        hang_ns = int(self.cfg.serve.hang_timeout_s * 1e9)
        in_flight = w.in_flight_since_ns
        if in_flight and now - in_flight > hang_ns:
            return False
        return now - w.last_progress_ns < hang_ns

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.monotonic_ns()
        w = self.worker
        published = w.counters["published"] if w else 0
        t_prev, obs_prev, pub_prev = self._rates_prev
        dt = (now - t_prev) / 1e9
        if dt >= 0.5:
            self.rates = {
                "observations_hz": round((self.counters["observations"] - obs_prev) / dt, 2),
                "actions_hz": round((published - pub_prev) / dt, 2),
            }
            self._rates_prev = (now, self.counters["observations"], published)
        d = self.backend_description
        counters = dict(self.counters)
        if w:
            counters.update(w.counters)
            counters["superseded"] = w.slot.superseded
            counters["guard"] = dict(w.guard.counts)
        counters["rejected"] = dict(self.rejected)
        latency = self.stats.summary()
        return {
            "version": __version__,
            "pid": os.getpid(),
            "state": self.state.state.value,
            "state_since_s": round((now - self.state.since_ns) / 1e9, 3),
            "uptime_s": round((now - self.started_ns) / 1e9, 3),
            "release": self.release_id,
            "backend": {
                "name": d.backend,
                "runtime": f"{d.runtime} {d.runtime_version}",
                "device": d.device,
                "providers": list(d.providers),
                "precision": d.precision,
            },
            "control_period_ms": self.contract.timing.control_period_ms,
            "rates": self.rates,
            "counters": counters,
            "heartbeat_age_s": round((now - self.last_heartbeat_ns) / 1e9, 3) if self.last_heartbeat_ns else None,
            "latency_ms": latency,
            "engine_ms": latency.get("engine"),
            "memory": {"host_rss_bytes": self.session.memory().host_rss_bytes},
        }


def serve(cfg: Config) -> int:
    """Run the daemon until stopped; expected start-up failures raise :class:`VladError`."""
    daemon = Daemon(cfg)
    return anyio.run(daemon.run, backend="asyncio")
