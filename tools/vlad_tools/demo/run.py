"""The demo: ``vlad serve`` on the embedded demo release, a simulated robot as controller.

The MuJoCo arm runs in real time at the contract's control period, driven by the episode
runner (:mod:`vlad_tools.episodes`, the demo's episode set: :mod:`vlad_tools.evaluation`): every period it publishes its camera frame, joint state and
instruction through :mod:`vlad.client` and sends a heartbeat, executes a chunk for
``--exec-steps`` periods before switching to the answer to its newest observation, and
holds position when it has nothing valid. After the episodes through vlad it runs the same
seeds with the same release in its own process and prints both success rates (the
fidelity check: with the same seeds and noise, an episode differs only where serving
changed something), the latency the controller saw, and ``vladctl status``.

    ./scripts/demo [--episodes 10] [--config etc/vlad/demo.toml] [--no-daemon-log] [--remote] [--openpi [--port 8000]]

``--remote`` serves the policy from a real KServe v2 server on 127.0.0.1 instead (what a
plugin offers through the ``vlad_remote_demo`` hook: the kserve plugin's
:mod:`vlad_kserve.demo`; local ONNX Runtime is its fallback), from a release copy in a
temporary folder. ``--openpi`` drives the arm with openpi's own client through vlad's
openpi-compatible endpoint on 127.0.0.1:``--port`` (:mod:`vlad_tools.demo.openpi`).

However the demo ends (done, an error, Ctrl-C, SIGTERM) it stops what it started (the
daemon, the v2 server) and removes its temporary folder; errors are one line.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

from vlad.cli.daemon import format_status
from vlad.client import Client
from vlad.config import Config, config_toml, load_config
from vlad.daemon.child import SOCKETS, DaemonFailed, DaemonProcess, launch
from vlad.release.loading import LoadedPolicy, PolicySource, load_policy
from vlad.snapshot import parse_status
from vlad_tools.demo import sim
from vlad_tools.episodes import DaemonLink, EpisodeLog, InProcessLink, contract_infer
from vlad_tools.evaluation import EpisodeSet, fidelity

ROOT = Path(__file__).resolve().parents[3]
OPENPI_PORT = 8000  # openpi's default


def start_daemon(cfg: Config, config: Path, quiet: bool, settings: list[str] | None = None) -> DaemonProcess:
    """``vlad serve --config config`` on the config's own sockets (so ``vladctl status`` sees
    it), its log on this terminal unless ``quiet``; returns once it is ready."""
    why = "; run it without --no-daemon-log to see why" if quiet else ""
    try:
        endpoints = {name: getattr(cfg.sockets, name) for name in SOCKETS}
        return launch(config, settings=settings or (), endpoints=endpoints, echo=not quiet)
    except DaemonFailed as exc:
        raise SystemExit(f"demo: {exc}{why}") from None


def port_number(text: str) -> int:
    """``--port``: a TCP port, 1..65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1..65535)")
    return port


def check_port_free(port: int) -> None:
    """One line and exit when 127.0.0.1:``port`` is taken, before anything is started (the
    daemon would refuse to start on it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the endpoint binds: a closed port is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise SystemExit(
                f"demo: port {port} on 127.0.0.1 is not free ({exc.strerror or exc}); pass --port with a free one"
            ) from None


class Stopped(BaseException):
    """SIGTERM or SIGHUP: end the demo the way Ctrl-C does, through every cleanup (a
    BaseException like KeyboardInterrupt, so no `except Exception` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stopped(signum: int, frame: object) -> None:
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=10, help="episodes, alternating the two instructions")
    ap.add_argument("--config", type=Path, default=ROOT / "etc" / "vlad" / "demo.toml")
    ap.add_argument("--seed", type=int, default=20_000)
    ap.add_argument("--exec-steps", type=int, default=4, help="periods to follow one chunk before the next")
    ap.add_argument("--no-daemon-log", action="store_true", help="hide the daemon's log lines")
    ap.add_argument(
        "--remote",
        action="store_true",
        help="serve the policy from a KServe v2 server on 127.0.0.1 (gRPC), local ONNX Runtime as fallback",
    )
    ap.add_argument(
        "--openpi",
        action="store_true",
        help="drive the arm with openpi's client (WebsocketClientPolicy + ActionChunkBroker) through "
        "vlad's openpi-compatible endpoint on 127.0.0.1:PORT",
    )
    ap.add_argument(
        "--port", type=port_number, default=OPENPI_PORT, help="with --openpi: the endpoint's port (default %(default)s)"
    )
    args = ap.parse_args(argv)

    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return run_with_cleanup(args)
    except KeyboardInterrupt:
        print("demo: interrupted; vlad is stopped and nothing is left behind", file=sys.stderr)
        return 130
    except Stopped as exc:
        print(f"demo: stopped by {signal.Signals(exc.signum).name}; nothing is left behind", file=sys.stderr)
        return 128 + exc.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_with_cleanup(args: argparse.Namespace) -> int:
    """The demo, then (on every way out) its processes stopped and its temporary folder removed."""
    if args.openpi:
        check_port_free(args.port)
    workdir: Path | None = None
    server: subprocess.Popen | None = None
    try:
        if args.remote:
            workdir = Path(tempfile.mkdtemp(prefix="vlad-demo-remote-"))
            args.config, server = start_remote(args.config, workdir)
        return run_demo(args)
    finally:
        # A second Ctrl-C must not leave a server or a daemon running: finish this first.
        masked = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            stop(server)
            stop_children()  # a v2 server interrupted while starting, or a daemon left by one
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        finally:
            for sig, handler in masked.items():
                signal.signal(sig, handler)


def start_remote(config: Path, workdir: Path) -> tuple[Path, subprocess.Popen]:
    """The remote demo a plugin offers (hook ``vlad_remote_demo``: :mod:`vlad_kserve.demo`),
    its daemon config written into ``workdir``; when the server fails, its one-line error
    carries the last line of the server's log (the folder holding the log is removed)."""
    from vlad.plugins import remote_demo

    start_remote_demo = remote_demo()
    if start_remote_demo is None:
        raise SystemExit(
            "demo: --remote needs a plugin that offers a remote demo server (vlad_kserve: "
            "pip install -e plugins/vlad_kserve 'vlad[kserve-server]'; ./scripts/demo --remote does)"
        )
    try:
        remote, server = start_remote_demo(config, workdir)
    except SystemExit as exc:
        message = str(exc.code).split("; see ")[0]
        log = workdir / "server.log"
        lines = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
        raise SystemExit(f"{message}: {lines[-1].strip()}" if lines else message) from None
    path = workdir / "vlad-remote.toml"
    path.write_text(
        "# Written by ./scripts/demo --remote: the demo policy on a local KServe v2 server.\n" + config_toml(remote)
    )
    print(f"demo: remote demo config {path}", flush=True)
    return path, server


def stop(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def stop_children(timeout: float = 10.0) -> None:
    """Terminate (then kill) every process this demo started that still runs."""
    import psutil

    children = psutil.Process().children()
    for child in children:
        child.terminate()
    _, alive = psutil.wait_procs(children, timeout=timeout)
    for child in alive:
        child.kill()


def load_in_process(cfg: Config) -> LoadedPolicy:
    """The release the daemon serves, loaded in this process too (verified the same way)."""
    r = cfg.release
    keys = r.keys_dir if r.verify else None
    return load_policy(PolicySource(Path(r.path), keys, r.backend, r.artifact, r.options, r.site_options), warmup=2)


def run_demo(args: argparse.Namespace) -> int:
    """Start the daemon on ``args.config``, run the episodes through it and the same seeds in
    process, print what happened."""
    cfg = load_config(args.config)
    print(f"demo: starting vlad serve --config {args.config}", flush=True)
    openpi = getattr(args, "openpi", False)
    if openpi:
        from vlad_tools.demo import openpi as demo_openpi

        settings = [*demo_openpi.OPENPI_SETTINGS, f"compat.openpi.listen='127.0.0.1:{args.port}'"]
        cfg = load_config(args.config, settings)
    daemon = start_daemon(cfg, args.config, args.no_daemon_log, settings if openpi else None)
    client = Client.from_config(cfg, name="mujoco-reacher")
    served: list[EpisodeLog] = []
    try:
        st = client.status()
        period_ns = int(st["control_period_ms"] * 1e6)
        print(f"demo: vlad is {st['state']}: {st['release']} on {st['backend']['name']} ({st['backend']['runtime']})")
        print(
            f"demo: simulated Reacher arm at {1e3 / st['control_period_ms']:.0f} Hz, {sim.EPISODE_STEPS} periods per episode,"
            f" success = fingertip within {sim.SUCCESS_RADIUS * 1000:.0f} mm of the goal at the end\n",
            flush=True,
        )
        if openpi:
            from vlad.contract import load_contract

            return demo_openpi.run_episodes(args, load_contract(Path(cfg.release.path) / "contract.toml"), args.port)
        local = load_in_process(cfg)
        contract = local.contract
        episodes = EpisodeSet.alternating(args.seed, args.episodes, sim.INSTRUCTIONS, args.exec_steps)
        play = functools.partial(episodes.play, period_ns=period_ns, chunk_length=contract.action.chunk_length)
        with sim.ReacherTask(render=False) as task:
            for i, r in enumerate(play(task, DaemonLink(client), label="through vlad")):
                served.append(r)
                lat = np.asarray(r.latencies_ms) if r.latencies_ms else np.asarray([np.nan])
                holds = sum(r.holds_adopted.values())
                print(
                    f"episode {i + 1:>3}  {r.instruction!r:<42} {'SUCCESS' if r.success else 'miss   '}"
                    f"  final distance {r.final_distance * 1000:6.1f} mm   sensor->action p50 {np.median(lat):5.2f} ms"
                    f"  max {lat.max():5.2f} ms   late {len(r.late)}  holds {holds}",
                    flush=True,
                )
            status = format_status(parse_status(client.status()))
            # The arm leaves the daemon while the in-process run goes on: a goodbye, so that
            # its silence is no lost controller (no fallback in the daemon's log).
            client.heartbeat(bye=True)
            print("\ndemo: the same seeds with the same release in this process (no daemon) ...", flush=True)
            inproc = InProcessLink.for_contract(contract, contract_infer(contract, local.tokenizer, local.session))
            reference = list(play(task, inproc, label="in process"))
        local.session.close()
        all_lat = np.concatenate([np.asarray(r.latencies_ms) for r in served if r.latencies_ms] or [np.zeros(1)])
        ok, ref_ok = sum(r.success for r in served), sum(r.success for r in reference)
        pair = fidelity(reference, served, episodes.instructions)
        flips = [f"{p['seed']} {'lost' if p['reference'] else 'gained'} ({p['why']})" for p in pair["flipped"]]
        print(
            f"\ndemo: through vlad {ok}/{len(served)} episodes succeeded, in process {ref_ok}/{len(reference)} "
            f"(same seeds, same noise); {pair['identical_episodes']} of {pair['episodes']} episodes identical tick "
            "for tick" + (f"; flipped: {', '.join(flips)}" if flips else "")
        )
        print(
            "demo: latency seen by the controller (sensor -> action received):"
            f" p50 {np.percentile(all_lat, 50):.2f} ms, p95 {np.percentile(all_lat, 95):.2f} ms,"
            f" p99 {np.percentile(all_lat, 99):.2f} ms over {len(all_lat)} chunks\n"
        )
        print("vladctl status (after the episodes through vlad):")
        print(status)
    finally:
        client.close()
        daemon.stop()
        daemon.cleanup()
    return 0 if served else 1


if __name__ == "__main__":
    sys.exit(main())
