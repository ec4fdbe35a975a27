"""``python -m vlad.compat openpi|metrics``: one endpoint process (started by ``vlad serve``)."""

from __future__ import annotations

import sys

from vlad.compat.endpoint import Endpoint, Spec, main


def _make(spec: Spec) -> Endpoint:
    if spec.kind == "openpi":
        from vlad.compat.openpi import OpenPIEndpoint

        return OpenPIEndpoint(spec)
    from vlad.compat.metrics import MetricsEndpoint

    return MetricsEndpoint(spec)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("openpi", "metrics"):
        sys.exit("usage: python -m vlad.compat openpi|metrics (started by vlad serve, spec on stdin)")
    sys.exit(main(sys.argv[1], _make))
