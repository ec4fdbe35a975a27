"""``vladctl plugins``: the installed plugins, their backends, and whether each runtime is usable here."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_plugins(args: argparse.Namespace) -> int:
    """List loaded plugins, their backends, versions and whether each runtime is usable."""
    from vlad.plugins import backend_plugins, backends, plugin_infos

    rows = []
    infos = plugin_infos()
    by_plugin = {info.name: info for info in infos}
    # Which plugin provides each backend, as pluggy registered it; the plugin's
    # distribution and version come from pluggy's list_plugin_distinfo (plugin_infos).
    provider = backend_plugins()
    for name, backend in sorted(backends().items()):
        info = by_plugin.get(provider.get(name, ""))
        avail = backend.availability()
        rows.append(
            {
                "backend": name,
                "plugin": info.name if info else provider.get(name, "?"),
                "distribution": info.distribution if info else "?",
                "plugin_version": info.version if info else "?",
                "runtime": avail.runtime,
                "runtime_version": avail.version,
                "usable": avail.usable,
                "devices": list(avail.devices),
                "reason": avail.reason,
            }
        )
    if args.json:
        print(json.dumps({"plugins": [vars(i) for i in infos], "backends": rows}, indent=2))
        return 0
    if not rows:
        print("no backend plugins loaded (check VLAD_PLUGINS and the installed plugins)")
        return 0
    print(f"{'backend':<12} {'plugin':<22} {'runtime':<24} {'usable':<7} devices / reason")
    for r in rows:
        runtime = f"{r['runtime']} {r['runtime_version'] or '-'}"
        plugin = f"{r['distribution']} {r['plugin_version']}"
        detail = ", ".join(r["devices"]) if r["usable"] else r["reason"]
        print(f"{r['backend']:<12} {plugin:<22} {runtime:<24} {'yes' if r['usable'] else 'no':<7} {detail}")
    return 0


def add_plugin_commands(sub: Any) -> None:
    p = sub.add_parser("plugins", help="list plugins, backends and whether their runtime is usable here")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plugins)
