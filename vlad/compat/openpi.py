"""An openpi-compatible websocket endpoint: openpi's ``WebsocketClientPolicy`` drives vlad.

The wire protocol is openpi's (``openpi/serving/websocket_policy_server.py`` and the PyPI
``openpi-client``): on connect the server sends a metadata map; then every binary message
from the client is a msgpack-numpy observation map and is answered with a msgpack-numpy
map holding ``actions`` (``float32[chunk_length, action_dim]``) and ``server_timing``
(``infer_ms``, and ``prev_total_ms`` from the second request on). An error is answered
with a text message, which openpi's client raises as ``RuntimeError``.

**Same path as a ZeroMQ controller.** The bridge does not call a policy. It turns the
request into a vlad ``obs`` message (camera, proprio and prompt keys from
``[compat.openpi]``), sends it on the daemon's observation socket (an extra ``inproc://``
endpoint bound at start, before the serving thread owns the socket) and waits for the
action chunk that answers that observation (same ``obs_seq`` and ``t_sensor_ns``) on the
action socket's own ``inproc://`` endpoint. So intake checks, preprocessing, the serving
policy or its fallback, decode, the final guard and the e-stop gate are the ones every
observation gets, and the counters and latency figures include openpi requests.

**Who may send.** ``sockets.observation_producers`` restricts *connections* to the
observation socket (ZAP on ipc/tcp). The bridge is inside the daemon and connects over
``inproc://``, which has no handshake: it needs no allow-list entry, and the websocket side
has its own rules (loopback or a unix socket by default; beyond loopback only with TLS and a
token).

**No stale chunk, ever.** A request answered by a hold posture (fallback, e-stop, backend
error), by nothing within ``request_timeout_ms`` (rejected, superseded, stale, expired) or a
chunk already past its ``valid_until`` gets an error reply naming the reason; the
connection stays open so the client can retry on its next control step. (openpi's own
server closes the connection after an error because its errors are exceptions; vlad's are
expected outcomes of a supervised robot.)

The bridge runs its own thread and asyncio loop: a websocket flood or a slow client never
delays the daemon's event loop (control, status, health) nor the serving thread.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import math
import ssl
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import zmq
import zmq.asyncio

from vlad import __version__, protocol
from vlad.config import OpenPIConfig, parse_listen
from vlad.errors import StartupError

if TYPE_CHECKING:
    from vlad.daemon.supervisor import Daemon

log = logging.getLogger("vlad.openpi")

OBS_INPROC = "inproc://vlad-openpi-obs"
ACT_INPROC = "inproc://vlad-openpi-actions"
MAX_RANK = 8
CLIENT_NAME = "openpi"
# The websockets library logs every connection at INFO; the bridge logs its own one line.
_ws_logger = logging.getLogger("vlad.openpi.websockets")
_ws_logger.setLevel(logging.WARNING)


class BadRequest(Exception):
    """A request the bridge cannot turn into an observation; ``reason`` is the counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


# -- msgpack-numpy, defensively -----------------------------------------------------------------


def _ndarray_hook(obj: dict) -> Any:
    """openpi's msgpack_numpy.unpack_array, minus what hostile input could abuse: only
    numeric dtypes (never object, void or strings), a bounded rank, and data of exactly the
    declared size (``np.ndarray(buffer=...)`` would read a short buffer past its end check
    only by raising, and accept object dtypes)."""
    if b"__ndarray__" in obj:
        try:
            dtype = np.dtype(obj[b"dtype"])
            shape = tuple(obj[b"shape"])
            data = obj[b"data"]
        except Exception as exc:
            raise BadRequest("malformed", f"array descriptor is invalid ({type(exc).__name__})") from None
        if dtype.kind not in "biuf" or dtype.hasobject:
            raise BadRequest("malformed", f"array dtype {dtype.str!r} is not numeric")
        if len(shape) > MAX_RANK or not all(type(d) is int and d >= 0 for d in shape):
            raise BadRequest("malformed", f"array shape {list(shape)[: MAX_RANK + 1]} is invalid")
        if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
            raise BadRequest("malformed", f"array data does not match shape {list(shape)} of {dtype.str}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if b"__npgeneric__" in obj:
        try:
            dtype = np.dtype(obj[b"dtype"])
            if dtype.kind not in "biuf":
                raise TypeError
            return dtype.type(obj[b"data"])
        except Exception:
            raise BadRequest("malformed", "numpy scalar is invalid") from None
    return obj


def unpack(raw: bytes, max_bytes: int) -> Any:
    try:
        return msgpack.unpackb(
            raw,
            object_hook=_ndarray_hook,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=max_bytes,
            max_ext_len=0,
            max_array_len=protocol.MAX_ITEMS,
            max_map_len=protocol.MAX_ITEMS,
        )
    except BadRequest:
        raise
    except Exception as exc:  # msgpack raises several types (and ValueError on deep nesting)
        raise BadRequest("malformed", f"not msgpack-numpy ({type(exc).__name__})") from None


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot pack {type(obj).__name__}")


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_pack_default)


# -- the bridge ---------------------------------------------------------------------------------


class OpenPIBridge:
    """The websocket server thread and its link to the daemon's sockets (see module doc)."""

    def __init__(self, cfg: OpenPIConfig, daemon: Daemon) -> None:
        self.cfg = cfg
        self.daemon = daemon
        contract = daemon.contract
        self.listen = parse_listen(cfg.listen)
        names = [c.name for c in contract.cameras]
        missing = [n for n in names if n not in cfg.cameras]
        unknown = [n for n in cfg.cameras if n not in names]
        if missing or unknown:
            wrong = [f"missing {', '.join(missing)}"] if missing else []
            wrong += [f"not in the contract: {', '.join(unknown)}"] if unknown else []
            raise StartupError(
                f"compat.openpi.cameras must name every contract camera ({', '.join(names)}): {'; '.join(wrong)}"
            )
        if contract.proprio is not None and not cfg.proprio:
            raise StartupError(
                f"compat.openpi.proprio: the contract needs a proprio vector of {contract.proprio.dim}; "
                "name the openpi key(s) that hold it"
            )
        self.language = contract.language is not None
        self.proprio_dim = contract.proprio.dim if contract.proprio is not None else None
        self.expect = {
            f"image/{c.name}": f"{c.raw.dtype}[{c.raw.height}, {c.raw.width}, 3]"
            if c.raw.layout == "HWC"
            else f"{c.raw.dtype}[3, {c.raw.height}, {c.raw.width}]"
            for c in contract.cameras
        }
        self.token = self._read_token()
        self.ssl = self._ssl_context()
        self.max_bytes = int(cfg.max_message_mb * 2**20)
        self.timeout_s = cfg.request_timeout_ms / 1e3
        self.metadata = {
            "server": "vlad",
            "version": __version__,
            "release": daemon.chain.release.id.release,
            "action_dim": contract.action.dim,
            "chunk_length": contract.action.chunk_length,
            "control_period_ms": contract.timing.control_period_ms,
            "cameras": dict(cfg.cameras),
            "proprio": list(cfg.proprio),
            "prompt": cfg.prompt,
        }
        # Counters: written on the bridge thread, read by status and metrics (copied under the lock).
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()  # connections, requests, replies
        self.errors: Counter[str] = Counter()  # error replies and refusals, by reason
        self.infer_ms: list[float] = []  # request -> chunk, last 1000 (status p50/p99)
        self._seq = itertools.count(1)
        self._clients = 0
        self._waiters: dict[tuple[int, int], asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None

    def _read_token(self) -> str:
        if not self.cfg.token_file:
            return ""
        try:
            token = Path(self.cfg.token_file).read_text().strip()
        except OSError as exc:
            raise StartupError(f"compat.openpi.token_file {self.cfg.token_file}: {exc.strerror}") from None
        if len(token) < 16:
            raise StartupError(f"compat.openpi.token_file {self.cfg.token_file}: the token needs >= 16 characters")
        return token

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.cfg.tls_cert:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # No TLS 1.3 session tickets: sent right after the handshake, they raced the client's
        # first request in asyncio's SSL layer here (about 1 connection in 50 got no answer
        # until the client's 10 s open timeout). Clients connect once and stay; resumption
        # buys nothing.
        ctx.num_tickets = 0
        try:
            ctx.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise StartupError(f"compat.openpi TLS certificate/key: {exc}") from None
        return ctx

    # -- lifecycle ---------------------------------------------------------------------------

    def bind_inproc(self, obs_sock: zmq.Socket, actions_sock: zmq.Socket) -> None:
        """Called before the serving thread starts (it owns the observation socket after)."""
        obs_sock.bind(OBS_INPROC)
        actions_sock.bind(ACT_INPROC)
        self.daemon.intake.rejection_listener = self._rejected

    def start(self, timeout: float = 10.0) -> None:
        self._thread = threading.Thread(target=self._run, name="vlad-openpi", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise StartupError("compat.openpi: the websocket server did not start within 10 s")
        if self._start_error is not None:
            raise self._start_error

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop already ended
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(); after start a crash is logged, never silent
            if not self._started.is_set():
                self._start_error = (
                    exc
                    if isinstance(exc, StartupError)
                    else StartupError(f"compat.openpi: cannot serve on {self.listen}: {exc}")
                )
                self._started.set()
            else:
                log.exception("openpi endpoint failed; it no longer serves")

    async def _main(self) -> None:
        import websockets.asyncio.server as ws_server

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        actx = zmq.asyncio.Context.shadow(self.daemon.ctx.underlying)
        self._pub = actx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 4)
        self._pub.connect(OBS_INPROC)
        self._sub = actx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_ACTIONS)
        self._sub.connect(ACT_INPROC)
        kwargs: dict[str, Any] = dict(
            compression=None,
            max_size=self.max_bytes,
            process_request=self._admit,
            ssl=self.ssl,
            ping_interval=5,
            ping_timeout=10,
            close_timeout=1,
            logger=_ws_logger,
        )
        try:
            if self.listen.unix:
                Path(self.listen.path).unlink(missing_ok=True)
                server = await ws_server.unix_serve(self._handler, self.listen.path, **kwargs)
            else:
                server = await ws_server.serve(self._handler, self.listen.host, self.listen.port, **kwargs)
        except BaseException as exc:
            # Close ours before the daemon's exit stack terminates the ZeroMQ context,
            # which would otherwise wait for these sockets forever.
            self._pub.close(0)
            self._sub.close(0)
            if isinstance(exc, OSError):
                raise StartupError(f"compat.openpi: cannot listen on {self.listen}: {exc.strerror or exc}") from None
            raise
        reader = asyncio.create_task(self._read_actions())
        beat = asyncio.create_task(self._heartbeats())
        log.info("openpi endpoint listening on %s%s", self.listen, " (TLS)" if self.ssl else "")
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            reader.cancel()
            beat.cancel()
            server.close()
            await server.wait_closed()
            self._pub.close(0)
            self._sub.close(0)
            if self.listen.unix:
                Path(self.listen.path).unlink(missing_ok=True)

    # -- admission -------------------------------------------------------------------------

    def _admit(self, connection: Any, request: Any) -> Any:
        """Before the websocket handshake: health check, token, connection limit."""
        import http

        if request.path == "/healthz":  # as openpi's server
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self.token:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Api-Key {self.token}".encode()):
                self._error("unauthorized", f"connection from {connection.remote_address}: bad or missing token")
                return connection.respond(http.HTTPStatus.UNAUTHORIZED, "vlad: missing or wrong api key\n")
        if self._clients >= self.cfg.max_clients:
            self._error(
                "busy",
                f"connection from {connection.remote_address} refused: "
                f"{self._clients} client(s) connected (compat.openpi.max_clients)",
            )
            return connection.respond(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                "vlad: another openpi client is connected (compat.openpi.max_clients)\n",
            )
        return None

    # -- one connection --------------------------------------------------------------------

    async def _handler(self, ws: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        self._clients += 1
        self._count("connections")
        log.info("openpi client %s connected", ws.remote_address)
        prev_total_ms: float | None = None
        try:
            await ws.send(pack(self.metadata))
            while True:
                try:
                    message = await ws.recv()
                except ConnectionClosed as exc:
                    if exc.rcvd is not None and exc.rcvd.code == 1009 or exc.sent is not None and exc.sent.code == 1009:
                        self._error(
                            "too_large",
                            f"message over compat.openpi.max_message_mb "
                            f"({self.cfg.max_message_mb:g} MiB): connection closed",
                        )
                    break
                start = time.monotonic()
                reply = await self._answer(message, prev_total_ms)
                try:
                    await ws.send(reply)
                except ConnectionClosed:
                    break
                prev_total_ms = (time.monotonic() - start) * 1e3
        except ConnectionClosed:
            pass
        finally:
            self._clients -= 1
            log.info("openpi client %s disconnected", ws.remote_address)

    async def _answer(self, message: Any, prev_total_ms: float | None) -> bytes | str:
        """One request -> the packed reply, or an error text (never an exception)."""
        t_receive = time.monotonic_ns()
        self._count("requests")
        try:
            if not isinstance(message, bytes):
                raise BadRequest("malformed", "expected a binary msgpack-numpy message, got text")
            obs = unpack(message, self.max_bytes)
            if not isinstance(obs, dict):
                raise BadRequest("malformed", f"expected an observation map, got {type(obs).__name__}")
            header, tensors = self._observation(obs, t_receive)
        except BadRequest as exc:
            return self._error(exc.reason, str(exc))
        except Exception:  # a bug: answered and logged, never the end of the endpoint
            log.exception("openpi request failed")
            return self._error("internal_error", "internal error (see the daemon's log)")
        # Engaged: the serving thread would not even ask the policy; say so at once rather
        # than after request_timeout_ms (a race with the gate ends in _why_not, same answer).
        if self.daemon.publisher.estop_engaged:
            return self._error("estop", "e-stop engaged: vlad sends no policy actions until it is released")
        key = (header["seq"], header["t_sensor_ns"])
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters[key] = future
        before = self._diagnostics()
        try:
            await self._pub.send_multipart(protocol.encode(protocol.TOPIC_OBS, header, tensors))
            chunk = await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            return self._error(*self._why_not(before))
        finally:
            self._waiters.pop(key, None)
        if isinstance(chunk, str):  # refused by the daemon's intake (see _rejected)
            return self._error(f"rejected_{chunk}", f"vlad refused the observation: {chunk}{self._hint(chunk)}")
        h = chunk.header
        source = h.get("source", "")
        if source.startswith("hold"):
            reason = source.partition(":")[2] or "hold"
            return self._error(
                f"hold_{reason}",
                f"vlad answered with the hold posture ({reason}, state "
                f"{h.get('state')}): no policy action for this observation",
            )
        now = time.monotonic_ns()
        if now > h["valid_until_ns"]:
            return self._error("expired", "the chunk for this observation expired before it could be sent")
        infer_ms = (now - t_receive) / 1e6
        self._count("replies")
        with self.lock:
            self.infer_ms.append(infer_ms)
            del self.infer_ms[:-1000]
        timing: dict[str, float] = {"infer_ms": infer_ms}
        if prev_total_ms is not None:
            timing["prev_total_ms"] = prev_total_ms
        return pack(
            {
                "actions": np.asarray(chunk.tensors["actions"], dtype=np.float32),
                "server_timing": timing,
                # vlad's own view of the cycle: which policy answered, and the stage timings.
                "policy_timing": {"infer_ms": float(h.get("timings_ms", {}).get("engine", 0.0))},
                "vlad": {
                    "release": h.get("release", ""),
                    "state": h.get("state", ""),
                    "policy": h.get("policy", ""),
                    "interventions": list(h.get("interventions", ())),
                    "timings_ms": dict(h.get("timings_ms", {})),
                    "valid_until_ns": h["valid_until_ns"],
                    "period_ns": h["period_ns"],
                },
            }
        )

    def _observation(self, obs: dict, t_receive: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The openpi observation as a vlad ``obs`` header and tensors (contract checks are
        the daemon's, on its observation socket; here only what the mapping needs)."""
        tensors: dict[str, np.ndarray] = {}
        for cam, key in self.cfg.cameras.items():
            img = _lookup(obs, key)
            if not isinstance(img, np.ndarray):
                raise BadRequest(
                    "bad_observation", f"{key!r} (camera {cam}) must be an image array, got {type(img).__name__}"
                )
            tensors[f"image/{cam}"] = img
        if self.cfg.proprio:
            parts = []
            for key in self.cfg.proprio:
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
                    f"proprio from {', '.join(self.cfg.proprio)} has {proprio.size} "
                    f"values, the contract needs {self.proprio_dim}",
                )
            tensors["proprio"] = proprio.astype(np.float32)
        header: dict[str, Any] = {"seq": next(self._seq), "t_sensor_ns": t_receive, "client": CLIENT_NAME}
        prompt = _find(obs, self.cfg.prompt)
        if prompt is None:
            prompt = self.cfg.default_prompt or None
        if isinstance(prompt, bytes):
            prompt = prompt.decode("utf-8", "replace")
        if prompt is not None and not isinstance(prompt, str):
            raise BadRequest("bad_observation", f"{self.cfg.prompt!r} must be a string, got {type(prompt).__name__}")
        if self.language and prompt is None:
            raise BadRequest(
                "bad_observation",
                f"no {self.cfg.prompt!r} in the observation and no "
                "compat.openpi.default_prompt; the policy needs an instruction",
            )
        if prompt is not None:
            header["instruction"] = prompt
        for name, arr in tensors.items():
            if arr.dtype.name not in protocol.WIRE_DTYPES:
                raise BadRequest("bad_observation", f"{name} has dtype {arr.dtype}; expected {self.expect.get(name)}")
        return header, tensors

    async def _heartbeats(self) -> None:
        """One ``hb`` per control period while an openpi client is connected. openpi has no
        heartbeat of its own; its client asks only when its chunk runs out, so an open
        websocket (kept alive by pings) stands for "the controller is there". A client
        that stops asking is still caught by the sensor-stall monitor."""
        period = self.daemon.contract.timing.control_period_ms / 1e3
        while True:
            await asyncio.sleep(period)
            if self._clients > 0:
                await self._pub.send_multipart(
                    protocol.encode(
                        protocol.TOPIC_HEARTBEAT,
                        {"seq": next(self._seq), "t_ns": time.monotonic_ns(), "client": CLIENT_NAME},
                    )
                )

    # -- chunks coming back ----------------------------------------------------------------

    async def _read_actions(self) -> None:
        try:
            await self._read_actions_forever()
        except asyncio.CancelledError:
            raise
        except Exception:  # without this task every request would time out: make it loud
            log.exception("openpi endpoint: reading action chunks failed; requests will time out")

    async def _read_actions_forever(self) -> None:
        while True:
            frames = await self._sub.recv_multipart()
            if not self._waiters:
                continue  # chunks for other controllers (or for nobody waiting any more)
            try:
                msg = protocol.decode(frames, expect=(protocol.TOPIC_ACTIONS,))
                key = (msg.header["obs_seq"], msg.header["t_sensor_ns"])
            except Exception:
                continue
            if msg.header.get("source") == "hold:bridge":
                continue  # the cadence thread covering a late inference: the real answer follows
            self._resolve(key, msg)

    def _rejected(self, header: dict[str, Any], reason: str) -> None:
        """Serving thread: an observation was refused; if it was ours, answer at once
        instead of letting the request run into its timeout."""
        if header.get("client") != CLIENT_NAME or self._loop is None:
            return
        key = (header.get("seq"), header.get("t_sensor_ns"))
        try:
            self._loop.call_soon_threadsafe(self._resolve, key, reason)
        except RuntimeError:
            pass  # the bridge's loop has ended

    def _resolve(self, key: tuple[Any, Any], result: Any) -> None:
        future = self._waiters.get(key)
        if future is not None and not future.done():
            future.set_result(result)

    # -- counting and diagnosis ------------------------------------------------------------

    def _diagnostics(self) -> dict[str, int]:
        """What the daemon counted so far that could swallow an observation silently."""
        d = self.daemon
        try:
            out = {f"rejected_{k}": v for k, v in dict(d.intake.counts.rejected).items()}
        except RuntimeError:  # the serving thread added a reason while we copied: no hint this time
            out = {}
        out["superseded"] = d.intake.counts.superseded
        for p in d.chain.policies:
            c = p.served.counts
            out["stale"] = out.get("stale", 0) + c.stale
            out["expired"] = out.get("expired", 0) + c.expired
            out["estop_blocked"] = out.get("estop_blocked", 0) + c.estop_blocked
        return out

    def _why_not(self, before: dict[str, int]) -> tuple[str, str]:
        """(reason, message) for a request that got no chunk in time. Judged from the
        daemon's counters that moved meanwhile: a hint, exact when this is the only client."""
        if self.daemon.publisher.estop_engaged:  # engaged while we waited: the policy was not asked
            return "estop", "e-stop engaged: vlad sends no policy actions until it is released"
        after = self._diagnostics()
        moved = [k for k, v in after.items() if v > before.get(k, 0)]
        limit = f"within compat.openpi.request_timeout_ms ({self.cfg.request_timeout_ms:g} ms)"
        for k in moved:
            if k.startswith("rejected_"):
                reason = k[len("rejected_") :]
                return f"rejected_{reason}", f"vlad refused the observation: {reason}{self._hint(reason)}"
        for k in ("stale", "superseded", "expired", "estop_blocked"):
            if k in moved:
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

    def _count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def _error(self, reason: str, message: str) -> str:
        with self.lock:
            self.errors[reason] += 1
            n = sum(self.errors.values())
        if n <= 10 or n % 1000 == 0:  # loud at first, then sampled: a broken client cannot flood the journal
            log.warning("openpi request refused (%d so far): %s: %s", n, reason, message)
        return f"vlad: {reason}: {message}"

    def report(self) -> dict[str, Any]:
        with self.lock:
            lat = list(self.infer_ms)
            out: dict[str, Any] = {
                "listen": str(self.listen),
                "clients": self._clients,
                **self.counts,
                "errors": dict(self.errors),
            }
        if lat:
            p50, p99 = np.percentile(lat, (50, 99))
            out["infer_ms"] = {"p50": round(float(p50), 3), "p99": round(float(p99), 3), "count": len(lat)}
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
