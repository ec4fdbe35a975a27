"""vlad's tests, a regular package: draccus 0.10.0 (a LeRobot dependency, the lerobot extra)
installs a top-level ``tests`` package into site-packages, which would otherwise shadow this
namespace package and break ``from tests.gates import ...``."""
