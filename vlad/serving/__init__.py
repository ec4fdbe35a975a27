"""Serving: the hot path and everything on it.

:mod:`~vlad.serving.loop` (the serving thread: intake -> preprocess -> infer -> decode ->
guard -> publish), :mod:`~vlad.serving.intake` (every check of an incoming message),
:mod:`~vlad.serving.guard` (the final action guard and the trusted joint state),
:mod:`~vlad.serving.publisher` (the e-stop gate and the action socket),
:mod:`~vlad.serving.cadence` (holds when no policy answers), :mod:`~vlad.serving.shadow`
(shadow runs and divergence), :mod:`~vlad.serving.tracing` (stage timings),
:mod:`~vlad.serving.counters` (typed counters), :mod:`~vlad.serving.policy`,
:mod:`~vlad.serving.realtime` (thread knobs).
"""
