"""Test hardware and the fault rig, loaded as a plugin: ``VLAD_PLUGIN_MODULES=vlad_tools.testing.plugin``.

* sensor ``injected``: readings from the JSON file named by ``$VLAD_TEST_SENSOR_FILE`` (it
  stands in for hardware sensors that cannot exist here, behind the real Sensor interface).

:func:`write_fault_rig` is the daemon the fault tests and ``scripts/bench_swap.py`` run: the
release on the ``wrapped`` backend (:mod:`vlad_tools.gates.wrapped`: faults and delays around a
real backend) with a control file, a previous release on real ONNX Runtime and the hold
posture as its fallback chain, an e-stop file and the injected sensor. :data:`PLUGIN_ENV`
loads both plugin modules, the wrapper and this one.
Nothing in vlad itself imports this module.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from vlad.config import (
    Config,
    MonitorsConfig,
    ReleaseConfig,
    SafetyConfig,
    ServeConfig,
)
from vlad.health.base import Sensor
from vlad.hookspecs import hookimpl
from vlad_tools.gates import wrapped
from vlad_tools.gates.wrapped import NAME
from vlad_tools.testing.releases import local_fallback, unsigned_copy

# The environment of a daemon that loads the wrapper backend and this plugin (vlad is
# installed: no PYTHONPATH).
PLUGIN_ENV = {"VLAD_PLUGIN_MODULES": f"{wrapped.__name__},{__name__}"}
SENSOR_FILE_ENV = "VLAD_TEST_SENSOR_FILE"


class InjectedSensor(Sensor):
    name = "injected"

    def read(self) -> dict[str, float]:
        path = os.environ.get(SENSOR_FILE_ENV)
        if not path:
            return {}
        try:
            data = json.loads(Path(path).read_text() or "{}")
            return {str(k): float(v) for k, v in data.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}  # an unreadable sensor reads nothing (the Sensor interface)


@hookimpl
def vlad_sensors() -> list[Sensor]:
    return [InjectedSensor()]


# -- the fault rig ----------------------------------------------------------------------------


@dataclass
class FaultRig:
    """A daemon config on the ``wrapped`` backend, and the files that steer it."""

    config: Config
    control: Path  # write a mode here: ok | raise | hang | nan | oob
    sensors: Path  # JSON readings of the injected sensor
    estop: Path  # the e-stop file: "engaged" / "0"
    primary: Path  # the release folder being served
    env: dict[str, str]  # the daemon's environment: the plugin and the sensor file


def write_fault_rig(folder: Path) -> FaultRig:
    """The release (an unsigned copy of the demo) on ``wrapped`` with a control file; a
    previous release (0.9.0, real ONNX Runtime) and the hold posture as its fallback chain;
    short hang timeout and healthy window, so a scenario takes seconds."""
    primary = unsigned_copy(folder / "release")
    previous = unsigned_copy(folder / "previous", version="0.9.0")
    control, sensors, estop = folder / "fault", folder / "sensors.json", folder / "estop"
    config = Config(
        release=ReleaseConfig(
            path=str(primary),
            verify=False,
            backend=NAME,
            artifact="policy.onnx",
            options={"control_file": str(control), "intra_op_threads": 1},
        ),
        serve=ServeConfig(warmup=3, hang_timeout_s=0.3),
        fallback=local_fallback(previous),
        monitors=MonitorsConfig(artifact_check_interval_s=0.2),
        safety=SafetyConfig(estop_file=str(estop)),
    )
    return FaultRig(config, control, sensors, estop, primary, {**PLUGIN_ENV, SENSOR_FILE_ENV: str(sensors)})
