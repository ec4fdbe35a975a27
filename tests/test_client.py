"""vlad.client.Client on real ZeroMQ sockets: every chunk up to a deadline, or the newest."""

from __future__ import annotations

import time

import numpy as np
import zmq

from vlad import protocol
from vlad.client import Client
from vlad_tools.testing import wait_until


def _chunk(seq: int) -> list[bytes]:
    now = time.monotonic_ns()
    header = {
        "seq": seq,
        "obs_seq": seq,
        "t_sensor_ns": now,
        "t_issue_ns": now,
        "valid_until_ns": now + 10**9,
        "period_ns": 20_000_000,
        "release": "r",
        "state": "ACTIVE",
        "source": "release:r",
    }
    return protocol.encode(protocol.TOPIC_ACTIONS, header, {"actions": np.zeros((8, 2), np.float32)})


def test_recv_until_returns_every_chunk_in_order_and_recv_actions_the_newest(tmp_path):
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"ipc://{tmp_path}/act")
    obs = ctx.socket(zmq.SUB)
    obs.bind(f"ipc://{tmp_path}/obs")
    client = Client(observations=f"ipc://{tmp_path}/obs", actions=f"ipc://{tmp_path}/act", send_hwm=64, reconnect_ms=10)
    try:
        # A SUB joins a PUB asynchronously: publish until the first chunk arrives.
        wait_until(lambda: pub.send_multipart(_chunk(0)) or client.recv_chunk(20) is not None, 5)
        client.recv_until(time.monotonic_ns() + 50_000_000)  # drain the joining chunks
        for seq in (1, 2, 3):
            pub.send_multipart(_chunk(seq))
        got = client.recv_until(time.monotonic_ns() + 200_000_000)
        assert [c.seq for c in got] == [1, 2, 3]
        assert client.recv_until(time.monotonic_ns()) == []  # nothing left, none waited for
        for seq in (4, 5, 6):
            pub.send_multipart(_chunk(seq))
        wait_until(lambda: client._act.poll(0), 2)
        time.sleep(0.2)  # all three queued on the SUB by then (ipc, same host): what recv_actions skips
        newest = client.recv_actions(timeout_ms=100)
        assert newest is not None and newest.seq == 6  # older ones skipped
    finally:
        client.close(bye=False)
        pub.close(0)
        obs.close(0)
        ctx.term()
