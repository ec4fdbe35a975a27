"""Health: the monitor interface (:mod:`~vlad.health.base`), the built-in monitors and
sensors, the fallback decisions (:mod:`~vlad.health.policy`) and the supervisor's state
machine (:mod:`~vlad.health.state`)."""
