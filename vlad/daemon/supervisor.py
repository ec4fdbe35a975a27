"""``vlad serve``: the supervisor that owns the sockets, the policies, the threads and every task.

Lifecycle (uvicorn-style): :func:`assemble` verifies, loads and warms the release *and
every fallback policy* (a swap never touches disk), binds the sockets, reads the e-stop
once and starts the serving, cadence and e-stop threads; then ``READY=1``.
:meth:`Daemon.main_loop` runs the event-loop tasks in one task group.

Composed once: :func:`assemble` builds every component, in one place and in dependency
order (no forward reference), and each one registers its own cleanup on the one exit
stack as it is opened or started. Unwinding that stack is the shutdown, in reverse: the
state says STOPPING, the serving thread stops intake and finishes (or abandons, after
``serve.shutdown_timeout_s``) its in-flight inference, the cadence thread, a shadow run
and the e-stop thread stop, a final status goes out, the endpoint processes and the tap
stop, then the sockets, the sessions and the listeners close. SIGTERM/SIGINT are handled
from before loading (:func:`serve`): one during a long load or warm-up stops the start-up
with ``STOPPING=1`` and exit status 0 (the stack closes what was opened so far); a second
one forces the exit.

Who runs where (docs/DESIGN): the **serving thread** (:mod:`vlad.serving.loop`) owns the
observation socket and runs the hot path; the **e-stop thread** (:mod:`vlad.daemon.safety`)
gates the publisher; the **cadence thread** keeps holds going out; the **event loop** runs
``control`` (vladctl), ``status``, ``health`` (monitors -> fallback decisions), ``watchdog``
and ``endpoints``; signals are handled by :func:`serve` around all of it. Release
operations live in :mod:`vlad.daemon.releases`, the chain in :mod:`vlad.daemon.chain`, the
control server and its commands in :mod:`vlad.daemon.control`, the status in
:mod:`vlad.daemon.status`, the health task and the state it decides in
:mod:`vlad.daemon.health`. Those components receive the parts they use (the control
server a :class:`~vlad.daemon.control.ControlPort`), never the :class:`Daemon`: only this
module and the CLI that starts it know it. What several of them read about what serves
now is one :class:`~vlad.serving.position.ServingState` (position, release, state), which
only the chain moves.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import zmq
import zmq.asyncio
from anyio.abc import TaskStatus

from vlad import protocol
from vlad.config import Config
from vlad.contract import Contract
from vlad.daemon import control, endpoints, status
from vlad.daemon.chain import ChainPolicy, PolicyChain
from vlad.daemon.health import HealthService, between_cycles
from vlad.daemon.memory import PolicyMemory, measured_load
from vlad.daemon.releases import ReleaseManager
from vlad.daemon.safety import EStop
from vlad.daemon.sockets import Gatekeeper, Principal, bind, load_curve, prepare_ipc
from vlad.daemon.systemd import Notifier
from vlad.daemon.tap import Tap, recorder_queue, tap_endpoint
from vlad.errors import StartupError
from vlad.health.state import State, StateMachine
from vlad.logs import context as log_context
from vlad.release.loading import LoadedPolicy, PolicySource, compatible, load_policy
from vlad.serving.cadence import HoldKeeper
from vlad.serving.counters import IntakeCounts, PublishCounts
from vlad.serving.guard import ActionGuard, TrustedState
from vlad.serving.intake import Intake
from vlad.serving.loop import ServingLoop
from vlad.serving.position import ServingState
from vlad.serving.publisher import Publisher
from vlad.serving.realtime import lock_memory
from vlad.serving.rehearsal import Rehearsal
from vlad.serving.tracing import LatencyStats

log = logging.getLogger("vlad.daemon")

SMALL_MESSAGE = 4096  # largest frame a peer may send on the action, status and e-stop sockets


class Daemon:
    """The running supervisor: what its own event-loop tasks use. Built by :func:`assemble`,
    which builds every component; every part is given, none optional."""

    def __init__(
        self,
        cfg: Config,
        *,
        notifier: Notifier,
        state: StateMachine,
        chain: PolicyChain,
        loop: ServingLoop,
        estop: EStop,
        status_sock: zmq.asyncio.Socket,
        status_model: status.StatusModel,
        control_server: control.ControlServer,
        controls: control.ControlPort,
        health: HealthService,
        tap: Tap | None,
        endpoint_processes: endpoints.Endpoints,
    ) -> None:
        self.cfg = cfg
        self.notifier = notifier
        self.state = state
        self.chain = chain
        self.loop = loop
        self.estop = estop
        self.status_sock = status_sock
        self.status_model = status_model
        self.control = control_server
        self.controls = controls  # what the control server answers through
        self.health = health
        self.tap = tap  # the recording tap (vlad.daemon.tap), when it has an endpoint
        self.endpoints = endpoint_processes
        self.period_ns = int(chain.release.loaded.contract.timing.control_period_ms * 1e6)
        self.status_seq = 0

    # -- the event loop ----------------------------------------------------------------------

    async def main_loop(self) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self.control.run, self.controls, name="control")
            for name, fn in (
                ("status", self._status_task),
                ("health", self.health.run),
                ("watchdog", self._watchdog_task),
                ("endpoints", self.endpoints.run),
            ):
                await tg.start(fn, name=name)
            self.notifier.ready(
                f"serving {self.chain.release.id.release} on {self.chain.release.served.session.describe().backend}"
            )

    async def final_status(self) -> None:
        """The last status, once serving stopped (the exit stack's; bounded to a second)."""
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(1.0):
                    await self._publish_status()
            except zmq.ZMQError:
                pass
            log.info("stopped")

    # -- status ----------------------------------------------------------------------------

    async def _status_task(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        period = 1.0 / self.cfg.serve.status_hz
        task_status.started()
        while True:
            await between_cycles(self.loop, self.period_ns)
            try:
                await self._publish_status()
            except Exception:  # a bug in status must not stop serving
                log.exception("status failed")
            await anyio.sleep(period)

    async def _publish_status(self) -> None:
        self.status_model.fold()
        snap = self.status_model.snapshot()
        st = snap.to_dict()
        if self.tap is not None and self.tap.subscribed:
            self.tap.tick(st, self.state.recent(100))
        self.status_seq += 1
        try:
            await self.status_sock.send_multipart(
                protocol.encode(protocol.TOPIC_STATUS, {"seq": self.status_seq, "status": st}), flags=zmq.NOBLOCK
            )
        except zmq.Again:
            pass
        e2e = snap.latency_ms.get("e2e")
        p99 = f", e2e p99 {e2e.p99:.2f} ms" if e2e else ""
        self.notifier.status(f"{snap.state} {snap.serving}, {snap.rates.actions_hz:.1f} actions/s{p99}")

    # -- systemd watchdog ------------------------------------------------------------------

    async def _watchdog_task(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        usec = self.notifier.watchdog_usec
        task_status.started()
        if not usec:
            await anyio.sleep_forever()
        interval = usec / 2e6
        warned = False
        while True:
            # This task runs on the event loop, so a dead loop stops the pings by itself;
            # the check catches a dead serving, cadence or e-stop thread and a hung engine.
            if self.making_progress():
                self.notifier.watchdog()
                warned = False
            elif not warned:
                log.error("control loop not making progress: withholding the systemd watchdog ping")
                warned = True
            await anyio.sleep(interval)

    def making_progress(self) -> bool:
        if not (self.loop.alive and self.estop.alive):
            return False
        now = time.monotonic_ns()
        hang = self.cfg.serve.hang_timeout_ns
        running = self.loop.in_flight
        if running is not None and now - running.since_ns > 2 * hang:
            return False  # the monitors did not get it unstuck
        return running is not None or now - self.loop.last_progress_ns < hang


# ---------------------------------------------------------------------------------------
# Start-up: everything loaded, bound and started, or one clear line why not
# ---------------------------------------------------------------------------------------


async def assemble(cfg: Config, stack: AsyncExitStack, notifier: Notifier, state: StateMachine) -> Daemon:
    s = cfg.sockets
    roles = {"observations": s.observations, "actions": s.actions, "status": s.status, "control": s.control}
    if cfg.safety.estop_endpoint:
        roles["estop"] = cfg.safety.estop_endpoint
    tap_ep = tap_endpoint(s.tap, s.control)
    if tap_ep:
        roles["tap"] = tap_ep
    # Refuse an endpoint another process serves, tcp without keys or an unknown principal
    # before spending seconds on loading.
    for endpoint in roles.values():
        prepare_ipc(endpoint, s.ipc_group)
    curve, curve_keys = None, set[bytes]()
    if any(e.startswith("tcp://") for e in roles.values()):
        if not (s.curve_secret_key and s.curve_clients_dir):
            raise StartupError(
                "tcp:// endpoints need CurveZMQ keys: set sockets.curve_secret_key and "
                "sockets.curve_clients_dir (or use ipc:// endpoints)"
            )
        curve, curve_keys = load_curve(s.curve_secret_key, s.curve_clients_dir)
    endpoints.check_fd_limit(cfg)
    # The openpi and metrics addresses: the daemon's from now until it exits, whatever
    # happens to the endpoint processes that serve on them.
    listeners = endpoints.listen(cfg)
    for listener in listeners.values():
        stack.callback(listener.close)
    allow = {}
    if s.observation_producers:
        allow["observations"] = [Principal(p) for p in s.observation_producers]
    if cfg.safety.estop_producers:
        allow["estop"] = [Principal(p) for p in cfg.safety.estop_producers]
    if tap_ep:  # camera frames: by default only this daemon's own user and root may record
        allow["tap"] = [Principal(p) for p in s.tap_subscribers or (f"uid:{os.geteuid()}", "uid:0")]
    lock_memory(cfg.realtime)

    # The release and every fallback policy: loaded and warmed now, never on the hot path.
    notifier.status("loading release")
    r = cfg.release
    keys_dir = r.keys_dir if r.verify else None
    if keys_dir is None:
        log.warning("release verification is OFF (release.verify = false): serving unsigned releases")
    sources = [("release", PolicySource(Path(r.path), keys_dir, r.backend, r.artifact, r.options, r.site_options))]
    releases = [e for e in cfg.fallback.chain if e.kind == "release"]
    for i, e in enumerate(releases):
        sources.append(
            (
                f"fallback{i + 1}",
                PolicySource(Path(e.path or ""), keys_dir, e.backend, e.artifact, e.options, r.site_options),
            )
        )
    loaded: list[tuple[str, LoadedPolicy]] = []
    memory: dict[str, PolicyMemory] = {}
    for name, source in sources:
        notifier.status(f"loading and warming {name} ({source.folder})")
        t0 = time.monotonic()
        policy, memory[name] = await anyio.to_thread.run_sync(
            measured_load,
            functools.partial(load_policy, source, cfg.serve.warmup, _progress(notifier, name)),
            abandon_on_cancel=True,  # a stop during a warm-up does not wait for it (see serve)
        )
        stack.callback(policy.session.close)
        if loaded:
            breaking = compatible(loaded[0][1].contract, policy.contract)
            if breaking:
                raise StartupError(
                    f"fallback {source.folder} has a contract incompatible with the release: {', '.join(breaking)}"
                )
        loaded.append((name, policy))
        log.info(
            "loaded %s %s on %s, %d warm-up inferences in %.2f s",
            name,
            policy.release_id,
            policy.session.describe().backend,
            cfg.serve.warmup,
            time.monotonic() - t0,
        )
    contract = loaded[0][1].contract
    period_ns = int(contract.timing.control_period_ms * 1e6)
    log_context.release = loaded[0][1].release_id

    ctx = zmq.Context()
    stack.callback(ctx.term)
    actx = zmq.asyncio.Context.shadow(ctx.underlying)
    gatekeeper = Gatekeeper(ctx, allow, curve_keys)
    gatekeeper.start()
    stack.callback(gatekeeper.stop)

    def make(
        c: zmq.Context, kind: int, role: str, max_message: int, rcvhwm: int | None = None, sndhwm: int | None = None
    ) -> Any:
        endpoint = roles[role]
        sock = c.socket(kind)
        sock.setsockopt(zmq.LINGER, s.linger_ms)
        stack.callback(sock.close, s.linger_ms)
        bind(sock, endpoint, role=role, max_message=max_message, rcvhwm=rcvhwm, sndhwm=sndhwm, curve=curve)
        if endpoint.startswith("ipc://"):
            stack.callback(Path(endpoint[len("ipc://") :]).unlink, missing_ok=True)
        return sock

    obs_sock = make(ctx, zmq.SUB, "observations", _largest_frame(contract), cfg.serve.observation_hwm)
    for topic in (protocol.TOPIC_OBS, protocol.TOPIC_HEARTBEAT):
        obs_sock.setsockopt(zmq.SUBSCRIBE, topic)
    # Send limits before the bind: libzmq copies them into each connection at bind time.
    actions_sock = make(ctx, zmq.PUB, "actions", SMALL_MESSAGE, sndhwm=16)
    status_sock = make(actx, zmq.PUB, "status", SMALL_MESSAGE, sndhwm=8)
    control_sock = make(actx, zmq.ROUTER, "control", protocol.MAX_REQUEST_BYTES, 64, sndhwm=64)
    tap = None
    if tap_ep:
        largest = _largest_observation(contract)
        tap = Tap(make(ctx, zmq.XPUB, "tap", SMALL_MESSAGE, sndhwm=recorder_queue(largest)), roles["tap"], largest)
    estop_sock = None
    if cfg.safety.estop_endpoint:
        estop_sock = make(ctx, zmq.SUB, "estop", SMALL_MESSAGE, 16)
        estop_sock.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_ESTOP)

    # The serving path. What serves now (position, release) and the state are one shared
    # object: the chain moves it, the publisher labels every chunk from it.
    serving = ServingState(state)
    trusted = TrustedState(contract, cfg.guard)
    guard = ActionGuard(contract, trusted, cfg.guard)
    stats = LatencyStats(cfg.serve.latency_window)
    heartbeat_limit_ns = cfg.monitors.heartbeat_missing_periods * period_ns
    intake = Intake(
        contract,
        IntakeCounts(),
        trusted,
        cfg.serve.max_clock_skew_ns,
        loaded[0][1].tokenizer,
        heartbeat_limit_ns=heartbeat_limit_ns,
    )
    publisher = Publisher(contract, actions_sock, guard, stats, PublishCounts(), serving, cfg.safety.estop_output)
    lead_ns = cfg.realtime.rehearse_lead_us * 1000
    loop = ServingLoop(
        ctx,
        obs_sock,
        intake,
        publisher,
        cfg.realtime,
        period_ns,
        history=contract.frames,
        rtc=cfg.serve.rtc == "on",
        rehearsal=Rehearsal(intake, publisher, lead_ns, cfg.guard) if lead_ns else None,
    )
    stack.callback(loop.close)
    chain = PolicyChain(
        [ChainPolicy.of(p, name, memory[name]) for name, p in loaded],
        cfg.fallback.healthy_window_ns,
        state,
        loop,
        serving,
    )
    cadence = HoldKeeper(loop, period_ns)

    # The event loop's components, each given the parts it uses.
    release_manager = ReleaseManager(cfg, chain, publisher, state)
    stack.push_async_callback(release_manager.close)  # a shadow run's thread
    health_out = status.HealthReadout()  # the last health tick's findings and readings
    health = HealthService(
        cfg,
        chain=chain,
        loop=loop,
        stats=stats,
        releases=release_manager,
        state=state,
        readout=health_out,
        period_ns=period_ns,
        deadline_ns=int(contract.timing.e2e_deadline_ms * 1e6),
    )
    estop = EStop(cfg.safety, estop_sock, publisher, period_ns, health.estop_changed)
    endpoint_processes = endpoints.build(cfg, contract, chain.release.id.release, gatekeeper, curve, listeners, state)
    control_server = control.ControlServer(control_sock, cfg.sockets)
    status_model = status.StatusModel(
        chain=chain,
        state=state,
        intake=intake,
        publisher=publisher,
        guard=guard,
        stats=stats,
        cadence=cadence,
        loop=loop,
        estop=estop,
        gatekeeper=gatekeeper,
        releases=release_manager,
        health=health_out,
        control_rejected=control_server.rejected,
        endpoints=endpoint_processes,
        tap=tap,
        control_period_ms=contract.timing.control_period_ms,
        heartbeat_limit_ns=heartbeat_limit_ns,
        realtime=cfg.realtime,
    )
    controls = control.DaemonControls(
        releases=release_manager,
        status=status_model.build,
        state=state,
        health=chain.health,
        controllers=intake.controllers,
        heartbeat_limit_ns=heartbeat_limit_ns,
    )
    daemon = Daemon(
        cfg,
        notifier=notifier,
        state=state,
        chain=chain,
        loop=loop,
        estop=estop,
        status_sock=status_sock,
        status_model=status_model,
        control_server=control_server,
        controls=controls,
        health=health,
        tap=tap,
        endpoint_processes=endpoint_processes,
    )

    # Started in order, each registering its stop as it starts: the stack unwinds in the
    # reverse order (the module doc).
    if tap is not None:  # the recording tap: fed from what the serving path already holds
        loop.tap, publisher.tap = tap.observation, tap.actions
        tap.start()
        stack.callback(tap.stop)
    stack.push_async_callback(endpoint_processes.stop)
    notifier.status("starting the endpoint processes")
    await endpoint_processes.start()
    stack.push_async_callback(daemon.final_status)  # once every thread below has stopped
    await health.first_decision()  # e.g. a remote release unreachable at start: FALLBACK from the start
    # The e-stop is read once before serving starts: a robot booted with it engaged never
    # sees a single policy chunk. Its thread stops last: the stop path outlives serving.
    estop.start()
    stack.callback(estop.stop)
    # The cadence thread stops after the serving thread (registered before it): holds keep
    # going out while the in-flight inference finishes.
    stack.callback(cadence.stop)
    loop.start()
    stack.push_async_callback(_stop_serving, loop, cfg.serve.shutdown_timeout_s)
    cadence.start()
    stack.push_async_callback(_announce_stop, state, notifier)  # the first thing a shutdown does
    if not estop.engaged and state.state == State.STARTING:
        state.transition(
            State.ACTIVE,
            "release loaded and warmed up",
            release=chain.release.id.release,
            chain=[str(i) for i in chain.ids()],
        )
    return daemon


async def _announce_stop(state: StateMachine, notifier: Notifier) -> None:
    state.transition(State.STOPPING, "shutdown requested")
    notifier.stopping("stopping: finishing in-flight inference")


async def _stop_serving(loop: ServingLoop, timeout: float) -> None:
    """Stop intake and let the in-flight inference finish, or abandon it after ``timeout``."""
    with anyio.CancelScope(shield=True):
        if not await anyio.to_thread.run_sync(loop.stop, timeout):
            log.warning("in-flight inference did not finish within %.1f s; abandoned", timeout)


def _progress(notifier: Notifier, name: str) -> Callable[[str], None]:
    """Start-up progress of loading ``name``: the log and systemd's STATUS= line."""

    def say(line: str) -> None:
        if line:
            log.info("%s: %s", name, line)
            notifier.status(f"loading {name}: {line}")

    return say


def _largest_observation(contract: Contract) -> int:
    """The largest legal observation message, every frame counted: the topic, the header
    limit and each tensor the contract has at its largest."""
    import numpy as np

    size = len(protocol.TOPIC_OBS) + protocol.MAX_HEADER_BYTES
    for cam in contract.cameras:
        r = cam.raw
        size += r.height * r.width * 3 * np.dtype(r.dtype).itemsize
    if contract.proprio is not None:
        size += contract.proprio.dim * 8
    return size


def _largest_frame(contract: Contract) -> int:
    """The largest frame a legal observation has: its biggest tensor, or the header limit."""
    import numpy as np

    sizes = [protocol.MAX_HEADER_BYTES]
    for cam in contract.cameras:
        r = cam.raw
        sizes.append(r.height * r.width * 3 * np.dtype(r.dtype).itemsize)
    if contract.proprio is not None:
        sizes.append(contract.proprio.dim * 8)
    return max(sizes)


def serve(cfg: Config) -> int:
    """Run the daemon until stopped; expected start-up failures raise :class:`VladError`.

    SIGTERM/SIGINT are handled before anything loads, so a stop during a minutes-long load
    or warm-up is clean: ``STOPPING=1`` at once, nothing further loads or binds, whatever
    was opened is closed by the exit stack, exit status 0 without waiting for the load
    thread's engine call (which cannot be interrupted)."""

    assembled = False

    async def run() -> int:
        nonlocal assembled
        notifier, state = Notifier(), StateMachine()
        async with AsyncExitStack() as stack:
            with anyio.CancelScope() as scope:
                _handle_signals(scope, state, notifier)
                daemon = await assemble(cfg, stack, notifier, state)
                assembled = True
                await daemon.main_loop()
        return 0

    code = anyio.run(run, backend="asyncio")
    if not assembled:
        # Stopped during start-up: the load thread still runs its engine call, which cannot
        # be interrupted; everything else is closed, so the exit does not wait for it.
        logging.shutdown()
        os._exit(code)
    return code


def _handle_signals(scope: anyio.CancelScope, state: StateMachine, notifier: Notifier) -> None:
    """The first SIGTERM/SIGINT cancels ``scope`` (start-up or the event-loop tasks; the exit
    stack then shuts down what was started); a second one forces the exit."""
    loop = asyncio.get_running_loop()

    def stop(signum: int) -> None:
        name = signal.Signals(signum).name
        log.info("%s received: shutting down", name)
        state.transition(State.STOPPING, f"{name} received")
        notifier.stopping(f"stopping: {name} received")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: os._exit(1))
        scope.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
