"""Real-time chunking's delay estimate and guide (vlad.serving.rtc); what the serving loop does
with it is in test_loop.py."""

from __future__ import annotations

import numpy as np

from vlad.serving.guard import Executing
from vlad.serving.rtc import RealTimeChunking, soft_mask

PERIOD = 20_000_000


def test_the_soft_mask_freezes_then_decays_to_the_end_of_the_executed_chunk():
    w = soft_mask(50, 5, 40)
    assert (w[:5] == 1.0).all() and (w[40:] == 0.0).all()
    assert (np.diff(w[5:40]) < 0).all() and 0.9 < w[5] < 1.0 and 0.0 < w[39] < 0.05
    assert (soft_mask(50, 5, 5)[5:] == 0).all()  # nothing of the old chunk beyond the delay
    assert (soft_mask(8, 20, 30) == 1).all()  # a delay beyond the chunk freezes all of it


def test_the_delay_is_whole_periods_of_the_recent_latency_robust_to_one_outlier():
    rtc = RealTimeChunking(PERIOD)
    assert rtc.delay_periods() == 0  # nothing measured yet: plain chunks
    for ms in (98, 103, 101, 99, 105, 100, 97, 104, 102, 100):
        rtc.published(ms * 1_000_000)
    assert rtc.delay_periods() == 6  # 104 ms: the chunk can be executed from the 6th period on
    rtc.published(400_000_000)  # one hiccup
    assert rtc.delay_periods() == 6


def test_a_chunk_arriving_within_its_first_period_is_computed_plain():
    rtc = RealTimeChunking(PERIOD)
    for _ in range(20):
        rtc.published(6_000_000)
    path = np.zeros((51, 2), np.float32)
    assert rtc.guide(Executing(path, 50, 7), 50) is None and rtc.delay == 0


def test_the_guide_is_the_executed_path_on_the_new_chunks_slots():
    rtc = RealTimeChunking(PERIOD)
    for _ in range(20):
        rtc.published(150_000_000)
    path = np.arange(102, dtype=np.float32).reshape(51, 2)  # slot -1, then slots 0..49
    guide = rtc.guide(Executing(path, 42, 7), 50)
    assert guide is not None and rtc.delay == 8
    np.testing.assert_array_equal(guide.actions, path[1:])
    np.testing.assert_array_equal(guide.weights, soft_mask(50, 8, 42))
