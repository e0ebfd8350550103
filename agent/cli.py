"""`tuimon-agent`: run the node agent, take one reading, or simulate a cluster."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import sys
from typing import Any

from aiohttp import web

from agent.collectors.storage import DEFAULT_MMPMON, StorageConfig
from agent.manual import SECTIONS as MANUAL_SECTIONS
from agent.node import AgentConfig, NodeAgent
from agent.sim.limits import MAX_GPUS, MAX_NODES
from agent.sim.scenarios import add_scenario_options
from tuimon_core import json_text
from tuimon_core.cli_docs import add_doc_options
from tuimon_core.cli_parser import Parser
from tuimon_core.cli_types import positive_float, positive_int
from tuimon_core.closed_pipe import quiet_on_closed_pipe
from tuimon_core.errors import UsageError
from tuimon_core.logs import add_log_level_option, log_to_stderr
from tuimon_core.overview import hello_port_ids
from tuimon_core.ports import DEFAULT_PORT
from tuimon_core.protocol.messages import Sample
from tuimon_core.protocol.overview_layout import readable
from tuimon_core.protocol.text import clean_lines
from tuimon_core.serving.guard import serve
from tuimon_core.serving.security import (
    ConfigError,
    check_bind_rule,
    load_token,
    parse_listen,
    server_ssl_context,
)
from tuimon_core.user_files import write_file
from tuimon_core.version import __version__

log = logging.getLogger("tuimon.agent")


def _common(p: argparse.ArgumentParser, log_level: str = "info") -> None:
    p.add_argument("--interval", type=positive_float(3600.0, least=0.01), default=1.0,
                   metavar="S",
                   help="sampling interval in seconds (default 1)")
    p.add_argument("--root", default="/", metavar="DIR",
                   help="prefix for every /sys and /proc path (e.g. /host in a container)")
    p.add_argument("--node-name", default="", metavar="NAME",
                   help="node name on the wire (default: the host name)")
    p.add_argument("--mmpmon", default=DEFAULT_MMPMON, metavar="PATH",
                   help=f"GPFS's mmpmon, for GPFS client statistics (default {DEFAULT_MMPMON};"
                        " empty: off)")
    add_log_level_option(p, log_level)
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of any error, usage errors too")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tuimon-agent",
        description="tuimon node agent: streams GPU and host metrics as msgpack frames "
                    "over a WebSocket and serves /metrics for Prometheus.")
    parser.add_argument("--version", action="version", version=f"tuimon-agent {__version__}")
    add_doc_options(parser, MANUAL_SECTIONS)
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="run the agent (the default)")
    _common(run)
    run.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", metavar="HOST:PORT",
                     help=f"address to serve on (default 127.0.0.1:{DEFAULT_PORT})")
    run.add_argument("--token-file", metavar="FILE",
                     help="bearer token clients must send; required off loopback")
    run.add_argument("--insecure", action="store_true",
                     help="allow a non-loopback address without a token")
    run.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS/WSS with this certificate")
    run.add_argument("--tls-key", metavar="FILE", help="the certificate's private key")
    run.add_argument("--max-clients", type=positive_int(100_000), default=256,
                     help="stream clients served at once (default 256)")
    run.add_argument("--steps-socket", metavar="PATH",
                     help="Unix datagram socket training ranks report steps to (default "
                          "$TUIMON_STEPS_SOCKET, /run/tuimon/steps.sock, "
                          "$XDG_RUNTIME_DIR/tuimon-steps.sock or /tmp/tuimon-steps.sock)")
    run.add_argument("--no-steps", action="store_true", help="do not listen for step reports")
    run.add_argument("--queue-frames", type=positive_int(100_000), default=32,
                     help="frames queued per stream client before the oldest drop (default 32)")

    once = sub.add_parser(
        "once", help="take two readings one interval apart, print one sample",
        description="Exit status: 0 when the node was read (anything of GPUs, host, "
                    "fabric, storage), 1 when nothing could be read, 2 on a usage error.")
    _common(once, log_level="warning")
    once.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sub.add_parser("relay", help="the relay is `tuimon relay` (in the viewer's install); "
                   "this runs it when that is installed", add_help=False)

    sim = sub.add_parser("sim", help="simulate a cluster: one real agent endpoint per node")
    sim.add_argument("--nodes", type=positive_int(MAX_NODES), default=4,
                     help=f"simulated nodes, each its own agent endpoint (default 4, at most "
                          f"{MAX_NODES})")
    sim.add_argument("--gpus", type=positive_int(MAX_GPUS, least=0), default=8,
                     help=f"GPUs a node (default 8, at most {MAX_GPUS}; 0: CPU-only nodes)")
    sim.add_argument("--base-port", type=int, default=19400, metavar="P",
                     help="node i listens on 127.0.0.1:(P+i) (default 19400)")
    sim.add_argument("--seed", type=int, default=0,
                     help="the simulation's random seed: one seed, one run (default 0)")
    sim.add_argument("--interval", type=positive_float(3600.0, least=0.01), default=1.0,
                     metavar="S", help="seconds between a node's samples (default 1)")
    sim.add_argument("--targets-file", metavar="F", help="write one host:port per line here")
    sim.add_argument("--topology-file", metavar="F",
                     help="write the simulated fabric as a Slurm topology.conf here")
    add_scenario_options(sim)
    add_log_level_option(sim)
    sim.add_argument("--debug", action="store_true",
                     help="show the traceback of any error, usage errors too")
    return parser


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["relay"]:
        return _relay_alias(args_list[1:])
    if not args_list or args_list[0] not in ("run", "once", "sim", "relay", "-h", "--help",
                                             "--version", "--print-completion",
                                             "--print-man"):
        args_list.insert(0, "run")
    args = build_parser().parse_args(args_list)
    log_to_stderr(args.log_level)
    try:
        if args.command == "once":
            return quiet_on_closed_pipe(lambda: _once(args))
        if args.command == "sim":
            return _sim(args)
        return _run(args)
    except UsageError as exc:  # what the user typed or configured: no traceback
        if args.debug:
            raise
        print(f"tuimon-agent: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _relay_alias(rest: list[str]) -> int:
    """`tuimon-agent relay`, from before the relay moved to the viewer's install: run
    `tuimon relay` when it is installed (the agent itself never imports the viewer)."""
    if importlib.util.find_spec("tuimon") is None:
        print("tuimon-agent: the relay is `tuimon relay`, part of the viewer's install "
              "(pip install tuimon)", file=sys.stderr)
        return 2
    os.execv(sys.executable, [sys.executable, "-m", "tuimon.cli", "relay", *rest])
    return 0  # not reached: execv replaces this process


def _run(args: argparse.Namespace) -> int:
    from agent.server import build_app

    listen = parse_listen(args.listen, DEFAULT_PORT)
    token = load_token(args.token_file) if args.token_file else None
    check_bind_rule(listen, token, args.insecure)
    ssl_ctx = server_ssl_context(args.tls_cert, args.tls_key)
    from agent.reporter import default_socket_path

    steps = None if args.no_steps else (args.steps_socket or default_socket_path())
    config = AgentConfig(node_name=args.node_name, interval=args.interval, root=args.root,
                         max_clients=args.max_clients, queue_frames=args.queue_frames,
                         steps_socket=steps, storage=StorageConfig(mmpmon=args.mmpmon or None))
    agent = NodeAgent(config)
    scheme = "https" if ssl_ctx else "http"
    app = build_app(agent, token=token)

    async def say_gpu_status(_: web.Application) -> None:
        if agent.gpu.status:
            log.warning("%s; the agent goes on with host metrics", agent.gpu.status)

    app.on_startup.append(say_gpu_status)
    if steps:
        # A live agent's step socket is refused now, before anything starts (a second
        # agent must not take over, or remove, the first one's telemetry).
        from agent.steps import StepSocketError, refuse_if_live

        try:
            refuse_if_live(steps)
        except StepSocketError as exc:
            raise ConfigError(str(exc)) from None

    def ready() -> None:  # said once it listens: an address in use is an error instead
        log.info("tuimon-agent %s on %s://%s (node %s, interval %.3g s)", __version__, scheme,
                 listen, config.node_name, config.interval)
    serve(app, listen, ssl_ctx, on_ready=ready)
    return 0


def _once(args: argparse.Namespace) -> int:
    config = AgentConfig(node_name=args.node_name, interval=args.interval, root=args.root,
                         watch_xid=False, storage=StorageConfig(mmpmon=args.mmpmon or None))
    sample, agent = asyncio.run(_take_one(config))
    report = once_report(agent, sample)
    if args.json:
        print(json_text.dumps(report, indent=2, sort_keys=True))
    else:
        print(format_once(report))
    return 0 if node_was_read(sample) else 1


def node_was_read(sample: Sample) -> bool:
    """Exit status of `once`: 0 when anything of the node was read (GPUs, host values,
    fabric ports or NICs, file systems or disks), 1 when nothing could be."""
    fabric = sample.extra.get("fabric") or {}
    storage = sample.extra.get("storage") or {}
    return bool(sample.gpus or fabric.get("ports") or fabric.get("nics")
                or storage.get("filesystems") or storage.get("disks")
                or any(v is not None for k, v in (sample.host or {}).items()
                       if k != "errors"))


async def _take_one(config: AgentConfig) -> tuple[Sample, NodeAgent]:
    agent = NodeAgent(config)
    await agent.start(sampling=False)
    try:
        # Only the sampler's first read is skipped: rates need two reads.
        await agent.sample_once()
        await asyncio.sleep(config.interval)
        sample = await agent.sample_once()
    finally:
        await agent.stop()
    return sample, agent


def once_report(agent: NodeAgent, sample: Sample) -> dict[str, Any]:
    hello = agent.hello
    assert hello is not None
    wire = sample.to_wire()
    if "overview" in wire:
        wire["overview"] = readable(wire["overview"], hello_port_ids(hello))
    return {
        "node": hello.node,
        "agent_version": hello.agent_version,
        "driver_version": hello.driver_version,
        "gpu_status": hello.gpu_status or ("ok" if hello.gpus else "no GPUs"),
        "inventory": [g.to_wire() for g in hello.gpus],
        "ports": hello.extra.get("ports") or [],
        "fabric_status": hello.extra.get("fabric_status"),
        "sample": wire,
    }


def _fmt(v: Any, scale: float = 1.0, unit: str = "", digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v / scale:.{digits}f}{unit}"


def format_once(report: dict[str, Any]) -> str:
    sample = report["sample"]
    lines = [f"node {report['node']}  agent {report['agent_version']}  "
             f"driver {report['driver_version'] or '-'}  GPUs: {report['gpu_status']}"]
    gpus = sample.get("gpus") or []
    if gpus:
        lines.append(f"{'GPU':>3} {'name':<24} {'util':>5} {'mem':>13} {'temp':>5} "
                     f"{'power':>11} {'SM clock':>9}  clock events")
    for info, g in zip(report["inventory"], gpus):
        if g.get("failed"):
            lines.append(f"{info['index']:>3} {(info['name'] or '?')[:24]:<24} FAILED: "
                         f"{g['failed']}")
            continue
        mem = f"{_fmt(g.get('mem_used'), 2**30)}/{_fmt(g.get('mem_total'), 2**30)} GiB"
        power = f"{_fmt(g.get('power'))}/{_fmt(g.get('power_limit'))} W"
        lines.append(
            f"{info['index']:>3} {(info['name'] or '?')[:24]:<24} "
            f"{_fmt(g.get('util'), 0.01, '%'):>5} {mem:>13} {_fmt(g.get('temp'), 1, 'C'):>5} "
            f"{power:>11} {_fmt(g.get('sm_clock'), 1e6, 'MHz'):>9}  "
            f"{', '.join(g.get('clock_events') or []) or '-'}")
    h = sample.get("host") or {}
    lines.append(
        f"host: cpu {_fmt(h.get('cpu_util'), 0.01, '%', 1)} of {_fmt(h.get('cpus'))} CPUs, "
        f"load {_fmt(h.get('load1'), 1, '', 2)}, mem {_fmt(h.get('mem_used'), 2**30, '', 1)}/"
        f"{_fmt(h.get('mem_total'), 2**30, '', 1)} GiB, up {_fmt(h.get('uptime'), 3600, ' h', 1)}")
    for field, reason in sorted((h.get("errors") or {}).items()):
        lines.append(f"  host {field}: {reason}")
    lines += _once_fabric(report, sample.get("fabric") or {})
    lines += _once_storage(sample.get("storage") or {})
    # Names come from /sys, /proc and NVML: nothing raw reaches the terminal.
    return clean_lines("\n".join(lines))


def _rate(v: Any) -> str:
    if v is None:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B/s"


def _once_fabric(report: dict[str, Any], fabric: dict[str, Any]) -> list[str]:
    ports = fabric.get("ports") or []
    if not ports:
        return [f"fabric: no ports ({report.get('fabric_status') or 'none found'})"]
    info = {p["id"]: p for p in report.get("ports") or []}
    lines = [f"{'port':<14} {'state':<8} {'rate':>10} {'tx':>11} {'rx':>11} "
             f"{'xmit_wait/s':>12}  errors"]
    for p in ports:
        errors = ", ".join(f"+{n} {k}" for k, n in sorted((p.get("errors_inc") or {}).items())
                           if n) or "-"
        lines.append(f"{p['id']:<14} {(p.get('state_name') or '-'):<8} "
                     f"{_rate(info.get(p['id'], {}).get('rate')):>10} "
                     f"{_rate(p.get('tx_bytes_s')):>11} {_rate(p.get('rx_bytes_s')):>11} "
                     f"{_fmt(p.get('xmit_wait_s')):>12}  {errors}")
    for n in fabric.get("nics") or []:
        lines.append(f"{n['id']:<14} {(n.get('operstate') or '-'):<8} {'':>10} "
                     f"{_rate(n.get('tx_bytes_s')):>11} {_rate(n.get('rx_bytes_s')):>11}")
    return lines


def _once_storage(storage: dict[str, Any]) -> list[str]:
    lines = []
    for f in storage.get("filesystems") or []:
        used = (f"{_fmt(f['size'] - f['free'], 1e12, ' TB', 1)} / "
                f"{_fmt(f['size'], 1e12, ' TB', 1)}"
                if f.get("size") and f.get("free") is not None else "-")
        lines.append(f"{f['id']:<24} {f.get('fstype', '-'):<7} "
                     f"read {_rate(f.get('read_bytes_s')):>10} "
                     f"write {_rate(f.get('write_bytes_s')):>10}  used {used}"
                     + (f"  {f['error']}" if f.get("error") else ""))
    for d in storage.get("disks") or []:
        lines.append(f"{d['id']:<24} {d.get('kind', '-'):<7} "
                     f"read {_rate(d.get('read_bytes_s')):>10} "
                     f"write {_rate(d.get('write_bytes_s')):>10}  busy "
                     f"{_fmt(d.get('busy'), 0.01, '%')}")
    return lines or ["storage: no file systems or disks found"]


def _sim(args: argparse.Namespace) -> int:
    from agent.sim.cluster import SimCluster, serve_forever

    cluster = SimCluster(nodes=args.nodes, gpus=args.gpus, base_port=args.base_port,
                         seed=args.seed, interval=args.interval, scenario=args.scenario,
                         fault_at=args.fault_at, speed=args.speed)
    if args.truth:
        write_file(args.truth, json.dumps(cluster.truth(), indent=2) + "\n", "--truth")
    if args.targets_file:
        write_file(args.targets_file, "".join(f"{t}\n" for t in cluster.targets),
                   "--targets-file")
    if args.topology_file:
        write_file(args.topology_file, cluster.topology_conf(), "--topology-file")
    try:
        asyncio.run(serve_forever(cluster))
    except OSError as exc:
        print(f"tuimon-agent sim: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
