"""``vlad serve``: the supervisor that owns the sockets, the policies and every task.

Lifecycle (uvicorn-style): :meth:`Daemon.startup` loads and warms the release *and every
fallback policy* (a swap never touches disk) and binds the sockets, then ``READY=1``;
:meth:`Daemon.main_loop` runs the named tasks in one task group; :meth:`Daemon.shutdown`
stops intake, lets in-flight inferences finish within a bound, publishes a final status
and closes the sockets with linger. A second SIGTERM/SIGINT forces the exit.

Tasks: ``intake`` (observations, heartbeats -> the serving policy's worker), ``cadence``
(hold postures while falling back or e-stopped; bridges a late inference), ``health``
(monitors -> :class:`vlad.health.policy.HealthPolicy` -> policy swaps and state), ``safety``
(the external e-stop), ``control`` (vladctl), ``status`` and ``watchdog`` (systemd).

The hot path itself lives in :mod:`vlad.serving.worker`; loading a release as a policy in
:mod:`vlad.release.loading`; deploy, rollback, shadow and canary in :mod:`vlad.daemon.releases`.
"""

from __future__ import annotations

import errno
import grp
import inspect
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
from vlad.daemon.releases import Canary, LiveReleases, Shadow
from vlad.errors import StartupError, VladError
from vlad.health.policy import Decision, HealthPolicy
from vlad.health.monitors import HealthView, MonitorThresholds
from vlad.release.loading import LoadedPolicy, compatible, load_policy
from vlad.serving.worker import Pending, PolicyWorker, Publisher, observation_from_message
from vlad.health.state import State, StateMachine
from vlad.daemon.systemd import Notifier
from vlad.daemon.systemd import context as log_context
from vlad.serving.tracing import LatencyStats

log = logging.getLogger("vlad.daemon")


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
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(f"endpoint {endpoint} is already in use") from None
        raise StartupError(f"cannot bind {endpoint}: {exc.strerror}") from None
    if endpoint.startswith("ipc://"):
        os.chmod(endpoint[len("ipc://") :], stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IWGRP)


# ---------------------------------------------------------------------------------------
# The supervisor
# ---------------------------------------------------------------------------------------


class Daemon(LiveReleases):
    """The supervisor: owns the sockets, the policies, the state and every task."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.state = StateMachine()
        self.notifier = Notifier()
        self.stats = LatencyStats(cfg.serve.latency_window)
        self.thresholds = MonitorThresholds.from_config(cfg.monitors)
        self.counters: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.started_ns = time.monotonic_ns()
        self.last_heartbeat_ns = 0
        self.last_observation_ns = 0
        self.last_obs = None  # the newest observation (its proprio feeds the hold posture)
        self.status_seq = 0
        self.stopping = False
        self.estop_engaged = False
        self.estop_source = ""
        self.state_before_estop = State.ACTIVE
        self.last_bridge_ns = 0
        self._rates_prev: tuple[int, int, int] = (time.monotonic_ns(), 0, 0)
        self.rates = {"observations_hz": 0.0, "actions_hz": 0.0}
        self.policies: list[LoadedPolicy] = []
        self.workers: list[PolicyWorker | None] = []  # None: the hold posture
        self.findings: list = []
        self.shadow: Shadow | None = None  # a shadow run, or the previous release during a canary
        self.canary: Canary | None = None
        self._canary_seen: set[str] = set()
        self._release_ops = anyio.Lock()
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
        endpoints = [s.observations, s.actions, s.status, s.control] + ([cfg.safety.estop_endpoint]
                                                                          if cfg.safety.estop_endpoint else [])
        # Refuse an endpoint another process serves, or tcp without keys, before spending
        # seconds on loading.
        for endpoint in endpoints:
            prepare_ipc(endpoint, s.ipc_group)
        if any(e.startswith("tcp://") for e in endpoints) and not (s.curve_secret_key and s.curve_clients_dir):
            raise StartupError("tcp:// endpoints need CurveZMQ keys: set sockets.curve_secret_key and "
                               "sockets.curve_clients_dir (or use ipc:// endpoints)")

        # The release and every fallback policy: loaded and warmed now, never on the hot path.
        self.notifier.status("loading release")
        specs = [("release", Path(cfg.release.path), cfg.release.backend, cfg.release.artifact, cfg.release.options)]
        for i, entry in enumerate(e for e in cfg.fallback.chain if e["kind"] == "release"):
            specs.append((f"fallback{i + 1}", Path(entry["path"]), entry.get("backend", ""),
                          entry.get("artifact", ""), entry.get("options", {})))
        keys_dir = cfg.release.keys_dir if cfg.release.verify else None
        if keys_dir is None:
            log.warning("release verification is OFF (release.verify = false): serving unsigned releases")
        for name, folder, backend, artifact, options in specs:
            self.notifier.status(f"loading and warming {name} ({folder})")
            t0 = time.monotonic()
            policy = await anyio.to_thread.run_sync(load_policy, name, folder, backend, artifact, options,
                                                    cfg.serve.warmup, keys_dir)
            stack.callback(policy.session.close)
            if self.policies:
                breaking = compatible(self.policies[0].contract, policy.contract)
                if breaking:
                    raise StartupError(f"fallback {folder} has a contract incompatible with the release: {', '.join(breaking)}")
            self.policies.append(policy)
            log.info("loaded %s %s on %s, %d warm-up inferences in %.2f s", name, policy.release_id, backend,
                     cfg.serve.warmup, time.monotonic() - t0)
        primary = self.policies[0]
        self.contract = primary.contract
        self.release_id = primary.release_id
        self.period_ns = int(self.contract.timing.control_period_ms * 1e6)
        log_context.release = self.release_id
        self.backend_description = primary.session.describe()
        chain_names = [f"{p.name}:{p.release_id}" for p in self.policies] + ["hold"]
        self.health = HealthPolicy(chain_names, int(cfg.fallback.healthy_window_s * 1e9), self.state)

        ctx = zmq.Context()
        stack.callback(ctx.term)
        actx = zmq.asyncio.Context.shadow(ctx.underlying)
        curve = await self._curve(actx, stack, endpoints)

        def make(kind: int, endpoint: str, async_: bool = True):
            sock = (actx if async_ else ctx).socket(kind)
            sock.setsockopt(zmq.LINGER, s.linger_ms)
            stack.callback(sock.close, s.linger_ms)
            if endpoint.startswith("tcp://"):
                sock.curve_secretkey, sock.curve_publickey = curve
                sock.curve_server = True
            bind(sock, endpoint, s.ipc_group)
            if endpoint.startswith("ipc://"):
                stack.callback(Path(endpoint[len("ipc://") :]).unlink, missing_ok=True)
            return sock

        self.obs_sock = make(zmq.SUB, s.observations)
        self.obs_sock.setsockopt(zmq.RCVHWM, cfg.serve.observation_hwm)
        for topic in (protocol.TOPIC_OBS, protocol.TOPIC_HEARTBEAT):
            self.obs_sock.setsockopt(zmq.SUBSCRIBE, topic)
        actions_sock = make(zmq.PUB, s.actions, async_=False)  # used under the Publisher's lock
        actions_sock.setsockopt(zmq.SNDHWM, 16)
        self.status_sock = make(zmq.PUB, s.status)
        self.control_sock = make(zmq.ROUTER, s.control)
        self.safety_sock = None
        if cfg.safety.estop_endpoint:
            self.safety_sock = make(zmq.SUB, cfg.safety.estop_endpoint)
            self.safety_sock.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_ESTOP)

        self.publisher = Publisher(self.contract, actions_sock, lambda: self.serving_release,
                                   lambda: self.state.state.value, self.stats)
        for p in self.policies:
            worker = PolicyWorker(name=p.name, contract=p.contract, tokenizer=p.tokenizer, session=p.session,
                                  release_id=p.release_id, publisher=self.publisher)
            worker.start()
            self.workers.append(worker)
        self.workers.append(None)  # the hold posture needs no worker
        stack.push_async_callback(self.shutdown)
        self.state.transition(State.ACTIVE, "release loaded and warmed up", release=self.release_id,
                              chain=chain_names)
        self.notifier.ready(f"serving {self.release_id} on {self.backend_description.backend}")

    async def _curve(self, actx, stack: AsyncExitStack, endpoints: list[str]):
        """CurveZMQ for tcp:// endpoints: encryption plus client authentication against the
        authorized-keys folder (ZAP). ipc:// relies on directory permissions instead."""
        if not any(e.startswith("tcp://") for e in endpoints):
            return None
        s = self.cfg.sockets
        import zmq.auth
        from zmq.auth.asyncio import AsyncioAuthenticator

        try:
            public, secret = zmq.auth.load_certificate(s.curve_secret_key)
        except (OSError, ValueError) as exc:
            raise StartupError(f"sockets.curve_secret_key {s.curve_secret_key}: {exc}") from None
        if secret is None:
            raise StartupError(f"sockets.curve_secret_key {s.curve_secret_key} holds no secret key")
        if not Path(s.curve_clients_dir).is_dir():
            raise StartupError(f"sockets.curve_clients_dir {s.curve_clients_dir} is not a folder")
        auth = AsyncioAuthenticator(actx)
        auth.start()
        auth.configure_curve(domain="*", location=s.curve_clients_dir)
        stack.callback(auth.stop)
        return secret, public

    @property
    def serving_release(self) -> str:
        i = self.health.active
        return self.policies[i].release_id if i < len(self.policies) else "hold"

    async def main_loop(self) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._signals_task, name="signals")
            tg.start_soon(self._intake_task, name="intake")
            tg.start_soon(self._cadence_task, name="cadence")
            tg.start_soon(self._health_task, name="health")
            tg.start_soon(self._safety_task, name="safety")
            tg.start_soon(self._control_task, name="control")
            tg.start_soon(self._status_task, name="status")
            tg.start_soon(self._watchdog_task, name="watchdog")

    async def shutdown(self) -> None:
        """Stop intake, finish or abandon in-flight inferences, final status, close."""
        with anyio.CancelScope(shield=True):
            if self.state.state != State.STOPPING:
                self.state.transition(State.STOPPING, "shutdown requested")
            self.notifier.stopping("stopping: finishing in-flight inference")
            self.stopping = True
            for w in [*self.workers, self.shadow.worker if self.shadow else None]:
                if w is not None:
                    finished = await anyio.to_thread.run_sync(w.stop, self.cfg.serve.shutdown_timeout_s)
                    if not finished:
                        log.warning("%s: in-flight inference did not finish within %.1f s; abandoned", w.name,
                                    self.cfg.serve.shutdown_timeout_s)
            try:
                await self._publish_status()
            except zmq.ZMQError:
                pass
            log.info("stopped")

    # -- tasks -----------------------------------------------------------------------------

    async def _signals_task(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                log.info("%s received: shutting down", name)
                self.state.transition(State.STOPPING, f"{name} received")
                self.stopping = True
                # A second signal while shutting down forces the exit.
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, lambda *_: os._exit(1))
                self._tg.cancel_scope.cancel()

    async def _intake_task(self) -> None:
        contract = self.contract
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
            self.last_observation_ns = receive_ns
            self.last_obs = obs
            if self.estop_engaged:
                continue  # no motion while the e-stop is engaged: the policy is not even asked
            worker = self.workers[self.health.active]
            if worker is not None:
                worker.slot.put(Pending(obs, receive_ns))
            if self.shadow is not None:
                self.shadow.worker.slot.put(Pending(obs, receive_ns))

    def _reject(self, exc: protocol.ProtocolError) -> None:
        self.rejected[exc.reason] += 1
        if exc.reason in ("bad_shape", "bad_dtype", "missing_tensor"):
            self.counters["rejected_shape"] += 1
        n = sum(self.rejected.values())
        # Loud for the first ones, then sampled, so a broken client cannot flood the journal.
        if n <= 10 or n % 1000 == 0:
            log.warning("rejected message (%d so far): %s", n, exc)

    def _hold(self, reason: str) -> None:
        obs = self.last_obs
        self.publisher.publish_hold(obs.proprio if obs else None, obs.sequence if obs else 0,
                                    obs.sensor_time_ns if obs else 0, reason)

    async def _cadence_task(self) -> None:
        """Keeps a command going out every control period when no policy produces one."""
        tick = self.period_ns / 4 / 1e9
        while True:
            await anyio.sleep(tick)
            now = time.monotonic_ns()
            since = now - self.publisher.last_publish_ns
            if self.estop_engaged:
                if self.cfg.safety.estop_output == "hold" and since >= self.period_ns:
                    self._hold("estop")
            elif self.workers[self.health.active] is None:
                if since >= self.period_ns and self.last_observation_ns:
                    self._hold("fallback")
            elif (self.publisher.last_publish_ns and since > 1.5 * self.period_ns
                  and now - max(self.last_observation_ns, self.last_heartbeat_ns) < self.period_ns):
                # The controller is there (observations or heartbeats keep coming) but no
                # command went out for 1.5 periods (a late or hung inference, stale, rejected
                # or missing observations): bridge with the hold
                # posture until the policy answers again or the monitors move down the chain.
                # 1.5 periods, not 1: scheduling jitter must not interleave holds with a
                # healthy policy's chunks.
                self.counters["bridged"] += 1
                self._hold("bridge")

    async def _health_task(self) -> None:
        from vlad.plugins import monitors, sensors

        monitor_list = monitors(self.cfg.monitors)
        sensor_list = sensors()
        period = 1.0 / self.cfg.fallback.monitor_hz
        prev: dict[str, int] = {}
        while True:
            await anyio.sleep(period)
            now = time.monotonic_ns()
            counters = self.all_counters()
            window = {k: v - prev.get(k, 0) for k, v in counters.items() if isinstance(v, int)}
            prev = {k: v for k, v in counters.items() if isinstance(v, int)}
            readings: dict[str, float] = {}
            for s in sensor_list:
                try:
                    readings.update(s.read())
                except Exception:
                    log.exception("sensor %s failed", s.name)
            worker = self.workers[self.health.active]
            view = HealthView(
                now_ns=now, period_ns=self.period_ns, deadline_ns=int(self.contract.timing.e2e_deadline_ms * 1e6),
                thresholds=self.thresholds, counters=counters, window=window, latency=self.stats.summary(),
                last_observation_ns=self.last_observation_ns, last_heartbeat_ns=self.last_heartbeat_ns,
                heartbeat_seen=self.last_heartbeat_ns > 0,
                in_flight_since_ns=worker.in_flight_since_ns if worker else 0,
                in_flight_policy=worker.policy_id if worker else None,
                release_policy=self.health.chain[0],
                hang_timeout_ns=int(self.cfg.serve.hang_timeout_s * 1e9), readings=readings,
                release_dir=self.policies[0].folder, artifacts=self.policies[0].artifacts,
            )
            findings = []
            for m in monitor_list:
                try:
                    findings.extend(m.check(view))
                except Exception:
                    log.exception("monitor %s failed", m.name)
            self.findings = findings
            self.readings = readings
            before = self.health.active
            decision = self.health.update(findings, now)
            if decision.target != before:
                self._swap(before, decision.target)
            try:
                await self._check_canary(findings)
            except Exception:  # a bug here must not take the serving loop down with it
                log.exception("canary check failed")
            if self.health.active != decision.target:  # a canary abort swapped back meanwhile
                decision = Decision(self.health.active, State.ACTIVE if self.health.active == 0 else State.FALLBACK,
                                    "canary aborted: previous release restored")
            if self.estop_engaged:
                self.state_before_estop = decision.state
            elif decision.state != self.state.state and self.state.state != State.STOPPING:
                self.state.transition(decision.state, decision.reason)

    def _swap(self, before: int, target: int) -> None:
        """Route to another policy of the chain. Every policy is loaded and warm, so this is
        a pointer change; the newest observation is handed over at once so the first
        command from the new policy does not wait for the next observation."""
        t0 = time.monotonic_ns()
        self.publisher.expect_swap(self.health.chain[target].split(":")[0], t0)
        new = self.workers[target]
        obs = self.last_obs
        if not self.estop_engaged:
            if new is None:
                self._hold("fallback")
            elif obs is not None and t0 - obs.sensor_time_ns < new.max_age_ns:
                new.slot.put(Pending(obs, self.last_observation_ns))
        self.state.record("swap", f"{self.health.chain[before]} -> {self.health.chain[target]}",
                          from_policy=self.health.chain[before], to_policy=self.health.chain[target],
                          switch_us=round((time.monotonic_ns() - t0) / 1e3, 1))

    async def _safety_task(self) -> None:
        """Reads the external e-stop; vlad never clears or overrides it."""
        cfg = self.cfg.safety
        estop_file = Path(cfg.estop_file) if cfg.estop_file else None
        timeout_ns = int(cfg.bridge_timeout_ms * 1e6)
        bridge_engaged = False
        while True:
            if self.safety_sock is not None:
                while await self.safety_sock.poll(0):
                    frames = await self.safety_sock.recv_multipart()
                    try:
                        msg = protocol.decode(frames, expect=(protocol.TOPIC_ESTOP,))
                        bridge_engaged = bool(msg.header["engaged"])
                        self.estop_source = str(msg.header.get("source", "bridge"))
                        self.last_bridge_ns = time.monotonic_ns()
                    except (protocol.ProtocolError, KeyError) as exc:
                        # A garbled safety message cannot be read as "released".
                        self._reject(exc if isinstance(exc, protocol.ProtocolError)
                                     else protocol.ProtocolError("malformed", "estop message without 'engaged'"))
                        bridge_engaged = True
            engaged = bridge_engaged
            reason = f"e-stop engaged ({self.estop_source or 'bridge'})"
            if cfg.require_bridge and time.monotonic_ns() - self.last_bridge_ns > timeout_ns:
                engaged, reason = True, "safety bridge silent: treated as e-stop engaged"
            if estop_file is not None:
                try:
                    if estop_file.read_text().strip().lower() in ("1", "engaged", "true"):
                        engaged, reason = True, f"e-stop engaged ({estop_file})"
                except FileNotFoundError:
                    pass
                except OSError:
                    engaged, reason = True, f"e-stop file {estop_file} unreadable: treated as engaged"
            if engaged and not self.estop_engaged:
                self.estop_engaged = True
                self.state_before_estop = self.state.state if self.state.state != State.ESTOPPED else State.ACTIVE
                self.state.transition(State.ESTOPPED, reason)
                if cfg.estop_output == "hold":
                    self._hold("estop")
            elif not engaged and self.estop_engaged:
                self.estop_engaged = False
                # Resume from where the robot is now, not from the last pre-e-stop command.
                self.publisher.guard.last_command = None
                self.state.transition(self.state_before_estop, "e-stop released by the safety system")
            await anyio.sleep(self.period_ns / 4 / 1e9)

    async def _control_task(self) -> None:
        """Control requests on a ROUTER socket (REQ clients see plain REP behaviour): each
        request is answered in its own task, so ``status`` still answers while a deploy
        loads and warms a release. Release operations run one at a time."""
        async with anyio.create_task_group() as tg:
            while True:
                frames = await self.control_sock.recv_multipart()
                if len(frames) < 3 or frames[-2] != b"":
                    self.rejected["malformed"] += 1  # not a REQ envelope: nothing to answer
                    continue
                tg.start_soon(self._answer, frames[:-1], frames[-1])

    async def _answer(self, envelope: list[bytes], frame: bytes) -> None:
        try:
            cmd, args = protocol.decode_request(frame)
            result = self.handle_control(cmd, args)
            if inspect.isawaitable(result):  # deploy, rollback, shadow: load and warm first
                async with self._release_ops:
                    result = await result
            reply = protocol.encode_reply(True, result)
        except protocol.ProtocolError as exc:
            self.rejected[exc.reason] += 1
            reply = protocol.encode_reply(False, error=str(exc))
        except VladError as exc:
            reply = protocol.encode_reply(False, error=str(exc))
        await self.control_sock.send_multipart([*envelope, reply])

    def handle_control(self, cmd: str, args: dict[str, Any]) -> Any:
        if cmd == "ping":
            return {"pong": True, "pid": os.getpid(), "version": __version__}
        if cmd == "status":
            return self.status()
        if cmd == "events":
            limit = int(args.get("limit", 100))
            return [e.to_dict() for e in list(self.state.events)[-limit:]]
        if cmd == "resume":
            why = str(args.get("why") or "")
            if not why:
                raise VladError("resume needs a reason (--why)")
            self.health.resume(str(args.get("who", "operator")), why)
            return {"quarantined": [], "state": self.state.state.value}
        if cmd == "deploy":
            return self.deploy(str(args["path"]), str(args.get("who", "operator")), str(args.get("why", "")),
                               bool(args.get("canary", False)), bool(args.get("force", False)))
        if cmd == "rollback":
            return self.rollback(str(args.get("who", "operator")), str(args.get("why", "")))
        if cmd == "history":
            from dataclasses import asdict

            return [asdict(e) for e in self.store().history()]
        if cmd == "shadow_start":
            return self.shadow_start(str(args["path"]), float(args.get("tolerance", 0.05)))
        if cmd == "shadow_report":
            if self.shadow is None:
                raise VladError("no shadow run (start one with `vladctl shadow start RELEASE`)")
            return self.shadow.report()
        if cmd == "shadow_stop":
            return self.shadow_stop()
        raise VladError(f"unknown control command {cmd!r} (known: ping, status, events, resume, deploy, rollback, "
                        "history, shadow_start, shadow_report, shadow_stop)")

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
        self.notifier.status(f"{st['state']} {st['serving']}, {st['rates']['actions_hz']:.1f} actions/s{p99}")

    async def _watchdog_task(self) -> None:
        usec = self.notifier.watchdog_usec
        if not usec:
            await anyio.sleep_forever()
        interval = usec / 2e6
        warned = False
        while True:
            # This task runs on the event loop, so a dead loop stops the pings by itself;
            # the check catches a hung engine or a dead inference thread.
            if self.making_progress():
                self.notifier.watchdog()
                warned = False
            elif not warned:
                log.error("control loop not making progress: withholding the systemd watchdog ping")
                warned = True
            await anyio.sleep(interval)

    def making_progress(self) -> bool:
        """The serving policy's thread is alive and not stuck (the hold posture always is)."""
        w = self.workers[self.health.active]
        if w is None:
            return True
        if not w.alive:
            return False
        now = time.monotonic_ns()
        hang_ns = int(self.cfg.serve.hang_timeout_s * 1e9)
        if w.in_flight_since_ns and now - w.in_flight_since_ns > hang_ns:
            return False
        return now - w.last_progress_ns < hang_ns

    # -- status ----------------------------------------------------------------------------

    def all_counters(self) -> dict[str, Any]:
        c: dict[str, Any] = dict(self.counters)
        for w in self.workers:
            if w is not None:
                for k, v in w.counters.items():
                    c[k] = c.get(k, 0) + v
                c[f"backend_errors:{w.policy_id}"] = w.counters.get("backend_errors", 0)
                c["superseded"] = c.get("superseded", 0) + w.slot.superseded
        c.update(self.publisher.counters)
        for k, v in self.publisher.guard.counts.items():
            c[f"guard_{k}"] = v
        return c

    def status(self) -> dict[str, Any]:
        now = time.monotonic_ns()
        counters = self.all_counters()
        published = counters.get("published", 0) + counters.get("published_hold", 0)
        t_prev, obs_prev, pub_prev = self._rates_prev
        dt = (now - t_prev) / 1e9
        if dt >= 0.5:
            self.rates = {
                "observations_hz": round((counters.get("observations", 0) - obs_prev) / dt, 2),
                "actions_hz": round((published - pub_prev) / dt, 2),
            }
            self._rates_prev = (now, counters.get("observations", 0), published)
        d = self.backend_description
        counters["rejected"] = dict(self.rejected)
        latency = self.stats.summary()
        return {
            "version": __version__,
            "pid": os.getpid(),
            "state": self.state.state.value,
            "state_since_s": round((now - self.state.since_ns) / 1e9, 3),
            "uptime_s": round((now - self.started_ns) / 1e9, 3),
            "release": self.release_id,
            "serving": self.health.chain[self.health.active],
            "chain": self.health.chain,
            "quarantined": {self.health.chain[i]: code for i, code in self.health.quarantined.items()},
            "estop": {"engaged": self.estop_engaged, "source": self.estop_source},
            "findings": [f.to_dict() for f in self.findings],
            "swaps_ms": list(self.publisher.swap_ms),
            "shadow": self.shadow.report() if self.shadow else None,
            "canary": self.canary.report(now) if self.canary else None,
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
            "temperatures_c": {k[len("temperature."):]: v for k, v in getattr(self, "readings", {}).items()
                               if k.startswith("temperature.")},
            "memory": {"host_rss_bytes": self.policies[0].session.memory().host_rss_bytes},
        }


def serve(cfg: Config) -> int:
    """Run the daemon until stopped; expected start-up failures raise :class:`VladError`."""
    daemon = Daemon(cfg)
    return anyio.run(daemon.run, backend="asyncio")
