"""The demo arm driven through vlad's openpi endpoint by openpi's own, unmodified client.

``openpi_client.websocket_client_policy.WebsocketClientPolicy`` talks to
``[compat.openpi]`` as the transport of the one episode runner (:mod:`vlad_tools.episodes`,
:class:`OpenPILink`): a request whenever the chunk executor asks for a chunk, every
``--exec-steps`` periods, which is the cadence of openpi's ``ActionChunkBroker``. The same
seeds through the native client or in process are then comparable episode by episode
(``tests/compat/test_openpi.py``). A request vlad answers with an error (a hold, an e-stop, a
refused observation) raises ``RuntimeError`` in the client; the runner then holds the arm
where it is and asks again on the next tick.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np

from vlad.client import ActionChunk
from vlad.contract import Contract
from vlad_tools.demo import sim
from vlad_tools.episodes import Frame
from vlad_tools.evaluation import EpisodeSet

# The keys this demo's [compat.openpi] mapping names (tests and etc/vlad/demo-openpi.toml).
IMAGE_KEY = "observation/image"
STATE_KEY = "observation/state"
OPENPI_SETTINGS = [
    "compat.openpi.enabled=true",
    f"compat.openpi.cameras={{overhead='{IMAGE_KEY}'}}",
    f"compat.openpi.proprio=['{STATE_KEY}']",
]


def connect(host: str, port: int) -> Any:
    """openpi's own websocket client on vlad's endpoint (it waits for the server to answer)."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    return WebsocketClientPolicy(host, port)


class OpenPILink:
    """openpi's ``WebsocketClientPolicy`` as the episode runner's transport (:mod:`vlad_tools.episodes`):
    one request when the chunk executor asks for a chunk (what openpi's ``ActionChunkBroker``
    does every ``action_horizon`` steps), in real time; an error reply is no answer (the arm
    holds), counted by reason in :attr:`errors`. The first request of an episode carries
    ``reanchor`` (the reset's jump, ``compat.openpi.reanchor``)."""

    realtime = True
    streams = False
    announces = False  # every message is a request

    def __init__(self, policy: Any, period_ns: int, validity_ns: int) -> None:
        self.policy = policy
        self.period_ns = period_ns
        self.validity_ns = validity_ns
        self.errors: Counter[str] = Counter()
        self._answer: ActionChunk | None = None

    def tick(self) -> None:
        pass  # the endpoint heartbeats for its clients

    def rest(self, period_ns: int) -> None:
        self._answer = None  # every request is answered before the next: nothing in flight

    def send(
        self,
        frame: Frame,
        seq: int,
        t_sensor_ns: int,
        *,
        reanchor: bool,
        wanted: bool,
        executing: tuple[int, int] | None = (-1, -1),
    ) -> None:
        if not wanted:
            return
        obs: dict[str, Any] = {
            IMAGE_KEY: frame.images["overhead"],
            STATE_KEY: frame.proprio,
            "prompt": frame.instruction,
        }
        if reanchor:
            obs["reanchor"] = True
        try:
            out = self.policy.infer(obs)
        except RuntimeError as exc:  # vlad's error reply: "vlad: <reason>: <what>"
            last = str(exc).splitlines()[-1]
            self.errors[last.removeprefix("vlad: ").split(":")[0]] += 1
            return
        now = time.monotonic_ns()
        v = out.get("vlad", {})
        self._answer = ActionChunk(
            seq=seq, obs_seq=seq, t_sensor_ns=t_sensor_ns, t_issue_ns=now, valid_until_ns=t_sensor_ns + self.validity_ns,
            period_ns=self.period_ns, release=str(v.get("release", "")), state=str(v.get("state", "")), source="release",
            interventions=tuple(v.get("interventions", ())), timings_ms=dict(v.get("timings_ms", {})),
            actions=np.asarray(out["actions"], np.float32), t_receive_ns=now,
        )  # fmt: skip

    def receive(self, seq: int, deadline_ns: int) -> list[ActionChunk]:
        answer, self._answer = self._answer, None
        return [answer] if answer is not None else []


def run_episodes(args: Any, contract: Contract, port: int) -> int:
    """``args.episodes`` episodes (alternating instructions) through openpi's client; prints each."""
    period_ns = int(contract.timing.control_period_ms * 1e6)
    link = OpenPILink(connect("127.0.0.1", port), period_ns, int(contract.timing.action_validity_ms * 1e6))
    print(
        f"demo: openpi's WebsocketClientPolicy on ws://127.0.0.1:{port}, a request every {args.exec_steps} periods\n",
        flush=True,
    )
    ok = 0
    episodes = EpisodeSet.alternating(args.seed, args.episodes, sim.INSTRUCTIONS, args.exec_steps)
    with sim.ReacherTask(render=False) as task:
        for i, r in enumerate(
            episodes.play(task, link, period_ns=period_ns, chunk_length=contract.action.chunk_length)
        ):
            ok += r.success
            lat = np.asarray(r.latencies_ms) if r.latencies_ms else np.asarray([np.nan])
            print(
                f"episode {i + 1:>3}  {r.instruction!r:<42} {'SUCCESS' if r.success else 'miss   '}"
                f"  final distance {r.final_distance * 1000:6.1f} mm   request p50 {np.median(lat):5.2f} ms"
                f"  held {r.held}",
                flush=True,
            )
    errors = ", ".join(f"{k} {v}" for k, v in link.errors.items()) or "none"
    print(f"\ndemo: {ok}/{args.episodes} episodes succeeded through vlad's openpi endpoint; error replies: {errors}")
    return 0
