"""An openpi-compatible websocket endpoint: openpi's ``WebsocketClientPolicy`` drives vlad.

The wire protocol is openpi's (``openpi/serving/websocket_policy_server.py`` and the PyPI
``openpi-client``): on connect the server sends a metadata map; then every binary message
from the client is a msgpack-numpy observation map and is answered with a msgpack-numpy
map holding ``actions`` (``float32[chunk_length, action_dim]``) and ``server_timing``
(``infer_ms``, and ``prev_total_ms`` from the second request on). An error is answered
with a text message, which openpi's client raises as ``RuntimeError``.

**Its own process, the daemon's own sockets.** This module runs in an endpoint process
(:mod:`vlad.compat.endpoint`, started and watched by :mod:`vlad.daemon.endpoints`), serves
on the listening socket the daemon bound and handed it, and is, to the daemon, one more
controller: it publishes each request as a vlad ``obs`` message on the daemon's
observation socket (camera, proprio and prompt keys from ``[compat.openpi]``, sensor time
= receive time) and waits for the action chunk that answers that observation (same
``obs_seq`` and ``t_sensor_ns``) on the action socket. So
intake checks, preprocessing, the serving policy or its fallback, decode, the final guard
and the e-stop gate are the ones every observation gets. What a websocket peer sends costs
this process's CPU, memory and file descriptors, never the daemon's.

**Liveness.** Each websocket client holds a slot (``openpi/1`` ... ``openpi/max_clients``)
and the endpoint heartbeats for it every control period while it is connected, with
``cadence = "request"`` (it asks only when its chunk runs out, so silence between requests
is no sensor stall). A client that closes its connection (a close frame) says goodbye; one
whose connection is lost is dead for the daemon until a client is back in its slot.

**No stale chunk, ever.** A request answered by a hold posture (fallback, e-stop, backend
error), refused or found stale by the daemon (its advisory rejected or stale hold says why,
at once), or answered by nothing within ``request_timeout_ms`` gets an
error reply naming the reason; so does a chunk already past its ``valid_until``. The
connection stays open.

**Bounds.** ``max_connections`` TCP connections in all and ``max_connections_per_peer``
per address (beyond: closed at accept, before any byte is read), the websocket handshake
within ``handshake_timeout_s``, ``max_clients`` websocket clients (beyond: HTTP 503, unless
a client has sent nothing for ``idle_timeout_s``: it is closed to make room), messages of
at most ``max_message_mb`` with at most 4096 objects (:mod:`vlad.compat.msgpack_numpy`).
"""

from __future__ import annotations

import asyncio
import hmac
import http
import itertools
import logging
import ssl
import time
from collections import Counter, deque
from typing import Any, cast

import numpy as np
import zmq
import zmq.asyncio
import zmq.utils.monitor

from vlad import __version__, protocol
from vlad.compat.endpoint import (
    ACCEPT_BACKLOG,
    Admission,
    Endpoint,
    EndpointStartError,
    Spec,
    client_socket,
    connect,
    listening_sockets,
    peer_of,
    section,
    status_updates,
)
from vlad.compat.msgpack_numpy import BadRequest, pack, unpack
from vlad.config import OpenPIConfig, parse_listen
from vlad.protocol import HoldKind
from vlad.snapshot import Counters, StatusSnapshot

log = logging.getLogger("vlad.openpi")

CLIENT_PREFIX = "openpi/"
# The websockets library logs every connection at INFO; this endpoint logs its own one line.
_ws_logger = logging.getLogger("vlad.openpi.websockets")
_ws_logger.setLevel(logging.WARNING)


class OpenPIEndpoint(Endpoint):
    """The websocket server and its link to the daemon's sockets (see module doc)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        cfg = self.cfg = section(spec, OpenPIConfig, "compat.openpi")
        self.contract = spec.contract
        self.listen = parse_listen(cfg.listen)
        self.token = spec.token
        self.ssl = self._ssl_context()
        self.max_bytes = int(cfg.max_message_mb * 2**20)
        self.timeout_s = cfg.request_timeout_ms / 1e3
        self.period_ns = int(self.contract["control_period_ms"] * 1e6)
        self.admission = Admission(cfg.max_connections, cfg.max_connections_per_peer)
        self.expect: dict[str, str] = self.contract["expect"]
        self.proprio_dim: int | None = self.contract.get("proprio_dim")
        self.metadata = {
            "server": "vlad",
            "version": __version__,
            "release": self.contract.get("release", ""),
            "action_dim": self.contract["action_dim"],
            "chunk_length": self.contract["chunk_length"],
            "control_period_ms": self.contract["control_period_ms"],
            "cameras": dict(cfg.cameras),
            "proprio": list(cfg.proprio),
            "prompt": cfg.prompt,
        }
        self.counts: Counter[str] = Counter()  # connections, requests, replies
        self.errors: Counter[str] = Counter()  # error replies and refusals, by reason
        self.infer_ms: deque[float] = deque(maxlen=1000)  # request -> chunk (status p50/p99)
        self.slots: list[Any] = [None] * cfg.max_clients  # the connection in each slot
        self.status: StatusSnapshot | None = None  # the daemon's newest status
        self._seq = itertools.count(1)
        self._waiters: dict[tuple[int, int], asyncio.Future] = {}
        self._servers: list[Any] = []
        self._tasks: list[asyncio.Task] = []

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.cfg.tls_cert:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # No TLS 1.3 session tickets: sent right after the handshake, they raced the client's
        # first request in asyncio's SSL layer (about 1 connection in 50 got no answer until
        # the client's 10 s open timeout). Clients connect once and stay; resumption buys nothing.
        ctx.num_tickets = 0
        try:
            ctx.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise EndpointStartError(f"compat.openpi TLS certificate/key: {exc}") from None
        return ctx

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> str:
        import websockets.asyncio.server as ws_server

        # The daemon's listening sockets: the address is never this process's to bind or free.
        listeners = listening_sockets(self.spec, "compat.openpi")
        ctx = self.ctx = zmq.asyncio.Context()
        socks, curve = self.spec.sockets, self.spec.curve
        self._pub = client_socket(ctx, zmq.PUB, socks["observations"], curve)
        self._pub.setsockopt(zmq.SNDHWM, 4)
        # Watched from before it connects: a handshake done before a monitor is attached
        # reports no event (a busy, niced process missed it and never became ready).
        admitted = self._pub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self._pub.connect(socks["observations"])
        self._act = connect(ctx, zmq.SUB, socks["actions"], curve)
        self._act.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_ACTIONS)
        self._act.setsockopt(zmq.MAXMSGSIZE, 1 << 20)
        self._st = connect(ctx, zmq.SUB, socks["status"], curve)
        self._st.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_STATUS)
        self._st.setsockopt(zmq.MAXMSGSIZE, 4 << 20)
        self._st.setsockopt(zmq.RCVHWM, 2)
        await self._admitted_by_daemon(admitted)
        endpoint = self

        class Connection(ws_server.ServerConnection):
            """Counted at accept: over a cap, closed before anything is read or allocated."""

            vlad_peer: str | None = None
            vlad_slot: int | None = None
            vlad_preempted = False  # its slot went to a new client
            vlad_last_ns = 0

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                peer = peer_of(transport)
                if not endpoint.admission.admit(peer):
                    endpoint.errors["connection_refused"] += 1
                    cast(asyncio.Transport, transport).abort()
                    return
                self.vlad_peer = peer
                self.vlad_last_ns = time.monotonic_ns()
                super().connection_made(transport)

            def connection_lost(self, exc: Exception | None) -> None:
                if self.vlad_peer is None:
                    return  # refused at accept: nothing was set up
                endpoint.admission.release(self.vlad_peer)
                self.vlad_peer = None
                endpoint._free_slot(self)
                super().connection_lost(exc)

        kwargs: dict[str, Any] = dict(
            compression=None,
            max_size=self.max_bytes,
            max_queue=2,  # messages buffered per connection: the client waits for each answer anyway
            process_request=self._admit,
            ssl=self.ssl,
            ping_interval=5,
            ping_timeout=10,
            close_timeout=1,
            open_timeout=self.cfg.handshake_timeout_s,
            logger=_ws_logger,
            create_connection=Connection,
            backlog=ACCEPT_BACKLOG,
        )
        try:
            for sock in listeners:
                self._servers.append(await ws_server.serve(self._handler, sock=sock, **kwargs))
        except OSError as exc:
            raise EndpointStartError(f"compat.openpi: cannot serve on {self.listen}: {exc.strerror or exc}") from None
        for name, fn in (("actions", self._read_actions), ("status", self._read_status), ("beat", self._heartbeats)):
            self._tasks.append(asyncio.create_task(self._forever(name, fn), name=name))
        log.info("openpi endpoint listening on %s%s", self.listen, " (TLS)" if self.ssl else "")
        return str(self.listen)

    async def _admitted_by_daemon(self, monitor: zmq.asyncio.Socket, timeout_s: float = 10.0) -> None:
        """Until the daemon's observation socket accepted this process (its allow list
        admits the daemon's own endpoint processes; ``monitor`` watches the observation
        socket's handshakes): requests sent before would be lost."""
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    event = zmq.utils.monitor.parse_monitor_message(await monitor.recv_multipart())
                    if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                        return
                    raise EndpointStartError("compat.openpi: the daemon's observation socket refused this process")
        except TimeoutError:
            raise EndpointStartError(
                f"compat.openpi: no connection to the daemon's observation socket within {timeout_s:g} s"
            ) from None
        finally:
            self._pub.disable_monitor()
            monitor.close(0)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for server in self._servers:
            server.close()
            await server.wait_closed()
        for i, conn in enumerate(self.slots):
            if conn is not None:
                self._beat(i, bye=True)
        for s in (self._pub, self._act, self._st):
            s.close(0)
        self.ctx.term()

    async def _forever(self, name: str, fn: Any) -> None:
        """A background loop that logs a bug and goes on (never a silent end)."""
        while True:
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("openpi endpoint: %s failed; restarting it", name)
                await asyncio.sleep(0.1)

    # -- admission -------------------------------------------------------------------------

    def _admit(self, connection: Any, request: Any) -> Any:
        """Before the websocket handshake: health check, token, a client slot."""
        if request.path == "/healthz":  # as openpi's server
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self.token:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Api-Key {self.token}".encode()):
                self._error("unauthorized", f"connection from {connection.remote_address}: bad or missing token")
                return connection.respond(http.HTTPStatus.UNAUTHORIZED, "vlad: missing or wrong api key\n")
        slot = self._take_slot(connection)
        if slot is None:
            self._error(
                "busy",
                f"connection from {connection.remote_address} refused: "
                f"{len(self.slots)} client(s) connected (compat.openpi.max_clients)",
            )
            return connection.respond(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                "vlad: another openpi client is connected (compat.openpi.max_clients)\n",
            )
        return None

    def _take_slot(self, connection: Any) -> int | None:
        """A free slot, or the slot of a client idle for over ``idle_timeout_s`` (closed)."""
        for i, conn in enumerate(self.slots):
            if conn is None:
                self.slots[i] = connection
                connection.vlad_slot = i
                return i
        idle_ns = int(self.cfg.idle_timeout_s * 1e9)
        now = time.monotonic_ns()
        i, oldest = min(enumerate(self.slots), key=lambda kv: kv[1].vlad_last_ns)
        if now - oldest.vlad_last_ns < idle_ns:
            return None
        log.warning(
            "openpi client %s idle for %.0f s: closed for a new client",
            oldest.remote_address,
            (now - oldest.vlad_last_ns) / 1e9,
        )
        self.counts["idle_closed"] += 1
        oldest.vlad_slot, oldest.vlad_preempted = None, True
        asyncio.get_running_loop().create_task(oldest.close(1001, "idle: slot given to a new client"))
        self.slots[i] = connection
        connection.vlad_slot = i
        return i

    def _free_slot(self, connection: Any) -> None:
        i = connection.vlad_slot
        if i is not None and self.slots[i] is connection:
            self.slots[i] = None
        connection.vlad_slot = None

    # -- one connection --------------------------------------------------------------------

    async def _handler(self, ws: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        slot = ws.vlad_slot
        self.counts["connections"] += 1
        log.info("openpi client %s connected (slot %s)", ws.remote_address, (slot or 0) + 1)
        prev_total_ms: float | None = None
        goodbye = False
        try:
            await ws.send(pack(self.metadata))
            while True:
                try:
                    message = await ws.recv()
                except ConnectionClosed as exc:
                    if (exc.rcvd is not None and exc.rcvd.code == 1009) or (
                        exc.sent is not None and exc.sent.code == 1009
                    ):
                        self._error(
                            "too_large",
                            f"message over compat.openpi.max_message_mb ({self.cfg.max_message_mb:g} MiB): "
                            "connection closed",
                        )
                    goodbye = exc.rcvd is not None and exc.rcvd.code in (1000, 1001)
                    break
                ws.vlad_last_ns = start = time.monotonic_ns()
                reply = await self._answer(message, prev_total_ms, slot)
                try:
                    await ws.send(reply)
                except ConnectionClosed:
                    break
                prev_total_ms = (time.monotonic_ns() - start) / 1e6
        except ConnectionClosed:
            pass
        finally:
            self._free_slot(ws)  # (connection_lost may have done it already)
            if goodbye and slot is not None and not ws.vlad_preempted:
                self._beat(slot, bye=True)  # left on purpose; a lost connection is a controller that died
            log.info("openpi client %s disconnected%s", ws.remote_address, "" if goodbye else " (no close frame)")

    async def _answer(self, message: Any, prev_total_ms: float | None, slot: int | None) -> bytes | str:
        """One request -> the packed reply, or an error text (never an exception)."""
        t_receive = time.monotonic_ns()
        self.counts["requests"] += 1
        try:
            if not isinstance(message, bytes):
                raise BadRequest("malformed", "expected a binary msgpack-numpy message, got text")
            obs = unpack(message, self.max_bytes)
            if not isinstance(obs, dict):
                raise BadRequest("malformed", f"expected an observation map, got {type(obs).__name__}")
            header, tensors = self._observation(obs, t_receive, slot)
        except BadRequest as exc:
            return self._error(exc.reason, str(exc))
        except Exception:  # a bug: answered and logged, never the end of the endpoint
            log.exception("openpi request failed")
            return self._error("internal_error", "internal error (see the daemon's log)")
        key = (header["seq"], header["t_sensor_ns"])
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters[key] = future
        before = self.status.counters if self.status is not None else None
        try:
            # Sent also while the e-stop is engaged: the daemon answers the newest observation
            # the moment the e-stop is released. While it is engaged, the next e-stop hold
            # (one every control period) answers this request (_read_actions).
            await self._pub.send_multipart(protocol.encode(protocol.TOPIC_OBS, header, tensors))
            chunk = await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            return self._error(*self._why_not(before))
        finally:
            self._waiters.pop(key, None)
        if isinstance(chunk, str):  # refused by the daemon's intake, or the e-stop
            if chunk == "estop":
                return self._error("estop", "e-stop engaged: vlad sends no policy actions until it is released")
            return self._error(f"rejected_{chunk}", f"vlad refused the observation: {chunk}{self._hint(chunk)}")
        if chunk.is_hold:
            kind = chunk.hold.value if chunk.hold is not None else "hold"
            return self._error(
                f"hold_{kind}",
                f"vlad answered with the hold posture ({kind}, state {chunk.state}): "
                "no policy action for this observation",
            )
        now = time.monotonic_ns()
        if chunk.is_stale(now):
            return self._error("expired", "the chunk for this observation expired before it could be sent")
        infer_ms = (now - t_receive) / 1e6
        self.counts["replies"] += 1
        self.infer_ms.append(infer_ms)
        timing: dict[str, float] = {"infer_ms": infer_ms}
        if prev_total_ms is not None:
            timing["prev_total_ms"] = prev_total_ms
        return pack(
            {
                "actions": np.asarray(chunk.actions, dtype=np.float32),
                "server_timing": timing,
                # vlad's own view of the cycle: which policy answered, and the stage timings.
                "policy_timing": {"infer_ms": float(chunk.timings_ms.get("engine", 0.0))},
                "vlad": {
                    "release": chunk.release,
                    "state": chunk.state,
                    "policy": chunk.policy,
                    "interventions": list(chunk.interventions),
                    "timings_ms": dict(chunk.timings_ms),
                    "valid_until_ns": chunk.valid_until_ns,
                    "period_ns": chunk.period_ns,
                },
            }
        )

    def _observation(self, obs: dict, t_receive: int, slot: int | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The openpi observation as a vlad ``obs`` header and tensors (contract checks are
        the daemon's, on its observation socket; here only what the mapping needs)."""
        cfg = self.cfg
        tensors: dict[str, np.ndarray] = {}
        for cam, key in cfg.cameras.items():
            img = _lookup(obs, key)
            if not isinstance(img, np.ndarray):
                raise BadRequest(
                    "bad_observation", f"{key!r} (camera {cam}) must be an image array, got {type(img).__name__}"
                )
            tensors[f"image/{cam}"] = img
        if cfg.proprio:
            parts = []
            for key in cfg.proprio:
                v = _lookup(obs, key)
                if isinstance(v, (int, float, np.generic)) and not isinstance(v, bool):
                    v = np.asarray([v])
                if not isinstance(v, np.ndarray) or v.dtype.kind not in "iuf" or v.ndim > 1:
                    raise BadRequest(
                        "bad_observation",
                        f"{key!r} must be a numeric vector, got {getattr(v, 'shape', type(v).__name__)}",
                    )
                parts.append(v.reshape(-1).astype(np.float64))
            proprio = np.concatenate(parts)
            if self.proprio_dim is not None and proprio.shape != (self.proprio_dim,):
                raise BadRequest(
                    "bad_observation",
                    f"proprio from {', '.join(cfg.proprio)} has {proprio.size} "
                    f"values, the contract needs {self.proprio_dim}",
                )
            tensors["proprio"] = proprio.astype(np.float32)
        client = f"{CLIENT_PREFIX}{(slot or 0) + 1}"
        header: dict[str, Any] = {"seq": next(self._seq), "t_sensor_ns": t_receive, "client": client}
        prompt = _find(obs, cfg.prompt)
        if prompt is None:
            prompt = cfg.default_prompt or None
        if isinstance(prompt, bytes):
            prompt = prompt.decode("utf-8", "replace")
        if prompt is not None and not isinstance(prompt, str):
            raise BadRequest("bad_observation", f"{cfg.prompt!r} must be a string, got {type(prompt).__name__}")
        if self.contract["language"] and prompt is None:
            raise BadRequest(
                "bad_observation",
                f"no {cfg.prompt!r} in the observation and no "
                "compat.openpi.default_prompt; the policy needs an instruction",
            )
        if prompt is not None:
            header["instruction"] = prompt
        if _find(obs, cfg.reanchor) is True:
            header["reanchor"] = True
        for name, arr in tensors.items():
            if arr.dtype.name not in protocol.WIRE_DTYPES:
                raise BadRequest("bad_observation", f"{name} has dtype {arr.dtype}; expected {self.expect.get(name)}")
        return header, tensors

    # -- the daemon's side ----------------------------------------------------------------

    def _beat(self, slot: int, bye: bool = False) -> None:
        header: dict[str, Any] = {
            "seq": next(self._seq),
            "t_ns": time.monotonic_ns(),
            "client": f"{CLIENT_PREFIX}{slot + 1}",
        }
        if bye:
            header["bye"] = True
        else:
            header["cadence"] = "request"
        try:
            self._pub.send_multipart(protocol.encode(protocol.TOPIC_HEARTBEAT, header), zmq.NOBLOCK)
        except zmq.Again:
            pass  # the daemon's queue is full: the next period's heartbeat will do

    async def _heartbeats(self) -> None:
        """One heartbeat per control period for every connected client (module doc)."""
        period_s = self.period_ns / 1e9
        while True:
            await asyncio.sleep(period_s)
            for i, conn in enumerate(self.slots):
                if conn is not None:
                    self._beat(i)

    async def _read_actions(self) -> None:
        while True:
            frames = await self._act.recv_multipart()
            try:
                chunk = protocol.decode_chunk(
                    protocol.decode(frames, expect=(protocol.TOPIC_ACTIONS,)), time.monotonic_ns()
                )
            except protocol.ProtocolError:
                continue
            key = (chunk.obs_seq, chunk.t_sensor_ns)
            if chunk.hold is HoldKind.ESTOP:  # engaged: no policy chunk will come, say so now
                for k in list(self._waiters):
                    self._resolve(k, "estop")
                continue
            if not self._waiters or chunk.hold is HoldKind.BRIDGE:
                continue  # chunks for other controllers; a bridge covers a late inference: the answer follows
            if chunk.advisory:  # refused or stale: no policy answer will come, say why now (a typed reason)
                self._resolve(key, str(chunk.reason or "refused"))
                continue
            self._resolve(key, chunk)

    async def _read_status(self) -> None:
        async for st in status_updates(self._st, self.counts):
            self.status = st
            self.metadata["release"] = st.release

    def _resolve(self, key: tuple[Any, Any], result: Any) -> None:
        future = self._waiters.get(key)
        if future is not None and not future.done():
            future.set_result(result)

    # -- counting and diagnosis ------------------------------------------------------------

    def _why_not(self, before: Counters | None) -> tuple[str, str]:
        """(reason, message) for a request that got no chunk in time, judged from the
        daemon's counters (its status) that moved meanwhile: a hint, exact when this is the
        only client."""
        st = self.status
        if st is not None and st.estop.engaged:  # with safety.estop_output = "silence" no hold says so
            return "estop", "e-stop engaged: vlad sends no policy actions until it is released"
        limit = f"within compat.openpi.request_timeout_ms ({self.cfg.request_timeout_ms:g} ms)"
        if st is not None and before is not None:
            after = st.counters
            for k, moved in (
                ("stale", after.stale > before.stale),
                ("superseded", after.superseded > before.superseded),
                ("expired", after.expired > before.expired),
                ("estop_blocked", after.estop_blocked > before.estop_blocked),
            ):
                if moved:
                    return k, f"no action chunk {limit}: the observation was {k.replace('_', ' ')}"
        return "timeout", f"no action chunk {limit}"

    def _hint(self, reason: str) -> str:
        if reason in ("bad_shape", "bad_dtype", "missing_tensor", "unknown_tensor"):
            return (
                " (the contract expects "
                + ", ".join(f"{n} {s}" for n, s in self.expect.items())
                + (f", proprio float32[{self.proprio_dim}]" if self.proprio_dim else "")
                + ")"
            )
        if reason in ("implausible_proprio", "proprio_out_of_limits"):
            return " (joint state beyond the limits, or it jumped: vlad re-anchors after a few consistent ones)"
        return ""

    def _error(self, reason: str, message: str) -> str:
        self.errors[reason] += 1
        n = sum(self.errors.values())
        if n <= 10 or n % 1000 == 0:  # loud at first, then sampled: a broken client cannot flood the journal
            log.warning("openpi request refused (%d so far): %s: %s", n, reason, message)
        return f"vlad: {reason}: {message}"

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "listen": str(self.listen),
            "clients": sum(c is not None for c in self.slots),
            "open_connections": self.admission.open,
            **self.counts,
            "errors": dict(self.errors),
            "refused_connections": dict(self.admission.refused),
        }
        if self.infer_ms:
            p50, p99 = np.percentile(np.asarray(self.infer_ms), (50, 99))
            out["infer_ms"] = {"p50": round(float(p50), 3), "p99": round(float(p99), 3), "count": len(self.infer_ms)}
        return out


def _find(obs: dict, key: str) -> Any:
    """``obs[key]``, else the nested ``obs[a][b]`` for ``key = "a.b"``; None when absent."""
    if key in obs:
        return obs[key]
    node: Any = obs
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _lookup(obs: dict, key: str) -> Any:
    value = _find(obs, key)
    if value is None:
        raise BadRequest("bad_observation", f"no {key!r} in the observation (keys: {', '.join(map(str, obs))[:200]})")
    return value
