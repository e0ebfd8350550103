"""Agent cost on a full node: CPU time per sample and resident memory, beside
node_exporter reading the same tree.

Runs the real agent (collectors, sampler, stream server) in a child process on a full
node: 8 fake GPUs (the fake pynvml answers in NVML's units; everything above it is the
real code) and a temporary /sys and /proc with 8 InfiniBand ports with hw_counters, a
NIC, 4 file systems and 8 disks (bench/node_tree.py), whose counters move twice a
second. It samples at its default 1 s interval, with one stream client (another
process) reading every frame and a /metrics scrape every 15 s. The child reports its
own CPU time and RSS, so the figures are the agent's alone.

In the same run, node_exporter (if installed) is started on the same tree with the
collectors that read the same files, scraped once a second, and its CPU time is read
from /proc/PID/stat. Repeated runs; medians are printed.

    .venv/bin/python bench/agent.py [--runs 3] [--seconds 20] [--interval 1.0]

Targets: at most 3 ms CPU per sample for the full node (2 ms for GPUs alone, #2),
at most 60 MB resident.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_CPU_MS = 3.0
TARGET_RSS_MB = 60.0


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _child(seconds: float, interval: float, gpus: int, tree: str) -> dict[str, float]:
    """The agent alone in this process; the client is the parent process."""
    from aiohttp import web

    from agent.files import FileTree
    from agent.node import AgentConfig, NodeAgent
    from agent.server import build_app
    from agent.sim.fake_nvml import FakeGpu, FakeNvml

    fake = FakeNvml([FakeGpu(i, util_gpu=95, mem_used=70 * 2**30, power_mw=650_000,
                             clock_events=0, procs=[(100 + i, 60 * 2**30)])
                     for i in range(gpus)])
    agent = NodeAgent(AgentConfig(node_name="bench", interval=interval, root=tree),
                      files=FileTree(tree), nvml_loader=lambda: fake)
    runner = web.AppRunner(build_app(agent), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(port, flush=True)
    while not agent.hub.clients:
        await asyncio.sleep(0.01)
    await asyncio.sleep(1.0)  # warm up: first reads, allocator, caches
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    n0 = agent.stats.samples
    await asyncio.sleep(seconds)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    n1 = agent.stats.samples
    out = {"samples": n1 - n0, "rss_mb": _rss_mb(),
           "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
           "collect_cpu_ms": agent.stats.last_sample_cpu * 1000,
           "dropped": agent.hub.dropped_total}
    await runner.cleanup()
    return out


async def _client(port: int, scrape_every: float) -> int:
    """Read every frame and scrape /metrics as Prometheus would, until the agent goes away."""
    import aiohttp

    frames = 0
    async with aiohttp.ClientSession() as s, s.ws_connect(
            f"http://127.0.0.1:{port}/v1/stream") as ws:
        next_scrape = time.monotonic() + scrape_every
        async for _ in ws:
            frames += 1
            if time.monotonic() >= next_scrape:
                next_scrape += scrape_every
                async with s.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    await resp.read()
    return frames


def _scrape_cost(gpus: int, n: int = 200) -> float:
    """CPU milliseconds one /metrics render takes for a node of `gpus` GPUs."""
    from agent.metrics import make_registry, render
    from agent.node import AgentConfig, NodeAgent
    from agent.sim.fake_nvml import FakeGpu, FakeNvml

    fake = FakeNvml([FakeGpu(i, clock_events=0x4) for i in range(gpus)])
    agent = NodeAgent(AgentConfig(node_name="bench", watch_xid=False),
                      nvml_loader=lambda: fake)

    async def prime() -> None:
        await agent.start(sampling=False)
        await agent.sample_once()
        await agent.stop()

    asyncio.run(prime())
    registry = make_registry(agent)
    render(registry)
    t0 = time.process_time()
    for _ in range(n):
        render(registry)
    return (time.process_time() - t0) / n * 1000


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _node_exporter_cpu_per_scrape(tree: Path, seconds: float, every: float) -> float | None:
    """node_exporter on the same tree, scraped at the agent's cadence: CPU ms per scrape."""
    import shutil
    import socket
    import urllib.request

    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, f"--path.sysfs={tree / 'sys'}", f"--path.procfs={tree / 'proc'}",
         "--collector.disable-defaults", "--collector.infiniband", "--collector.netdev",
         "--collector.diskstats", "--collector.meminfo", "--collector.stat",
         "--collector.loadavg", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                time.sleep(0.1)
        for _ in range(3):  # warm up
            urllib.request.urlopen(url, timeout=5).read()
        c0 = _proc_cpu_s(proc.pid)
        n = 0
        t_end = time.monotonic() + seconds
        next_at = time.monotonic()
        while time.monotonic() < t_end:
            urllib.request.urlopen(url, timeout=5).read()
            n += 1
            next_at += every
            time.sleep(max(0.0, next_at - time.monotonic()))
        return 1000 * (_proc_cpu_s(proc.pid) - c0) / max(1, n)
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=1.0,
                    help="sampling interval (default 1 s, the agent's own default)")
    ap.add_argument("--scrape-every", type=float, default=15.0,
                    help="seconds between /metrics scrapes (Prometheus default 15)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--gpus-only", action="store_true",
                    help="issue #2's node: 8 GPUs and this machine's /proc, no fabric or "
                         "storage tree, no node_exporter")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args.seconds, args.interval, args.gpus,
                                            args.tree))))
        return
    import tempfile

    import node_tree

    if args.gpus_only:
        tree, mover = Path("/"), None
    else:
        tree = node_tree.build(Path(tempfile.mkdtemp(prefix="tuimon-bench-")))
        mover = node_tree.Mover(tree)
        mover.start()
    runs = []
    exporter_runs: list[float] = []
    for i in range(args.runs):
        ne = (None if args.gpus_only else
              _node_exporter_cpu_per_scrape(tree, args.seconds, args.interval))
        if ne is not None:
            exporter_runs.append(ne)
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", "--seconds", str(args.seconds),
             "--interval", str(args.interval), "--gpus", str(args.gpus), "--tree", str(tree)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        frames = asyncio.run(_client(port, args.scrape_every))
        r = json.loads(proc.stdout.read().strip().splitlines()[-1])
        proc.wait()
        r["frames_received"] = frames
        r["cpu_ms_per_sample"] = 1000 * r["cpu_s"] / max(1, r["samples"])
        runs.append(r)
        print(f"run {i + 1}: {r['samples']} samples, {r['cpu_ms_per_sample']:.3f} ms CPU/sample "
              f"(collect alone {r['collect_cpu_ms']:.3f} ms), RSS {r['rss_mb']:.1f} MB"
              + (f"; node_exporter {ne:.3f} ms CPU/scrape" if ne is not None else ""),
              flush=True)
    if mover is not None:
        mover.stop()
        node_tree.remove(tree)
    cpu = statistics.median(r["cpu_ms_per_sample"] for r in runs)
    collect = statistics.median(r["collect_cpu_ms"] for r in runs)
    rss = statistics.median(r["rss_mb"] for r in runs)
    scrape = _scrape_cost(args.gpus)
    print()
    node = ("this machine's /proc, no fabric or storage" if args.gpus_only
            else "8 IB ports, 4 file systems, 8 disks")
    target = 2.0 if args.gpus_only else TARGET_CPU_MS
    print(f"| figure ({args.gpus} fake GPUs, {node}, 1 stream client, interval "
          f"{args.interval} s, /metrics every {args.scrape_every} s) "
          f"| median of {args.runs} | target |")
    print("|---|---|---|")
    print(f"| CPU per sample, whole agent process | {cpu:.3f} ms | <= {target} ms |")
    print(f"| CPU per sample, collectors alone | {collect:.3f} ms | |")
    print(f"| share of one core at 1 Hz | {cpu / 10:.3f} % | <= {target / 10:.1f} % |")
    print(f"| resident memory | {rss:.1f} MB | <= {TARGET_RSS_MB} MB |")
    print(f"| one /metrics render (CPU) | {scrape:.2f} ms | |")
    ne_median = statistics.median(exporter_runs) if exporter_runs else None
    if ne_median is not None:
        print(f"| node_exporter, same tree (infiniband, netdev, diskstats, meminfo, stat, "
              f"loadavg), CPU per 1 Hz scrape | {ne_median:.3f} ms | |")
        print(f"| ratio: tuimon agent sample / node_exporter scrape | "
              f"{cpu / ne_median:.2f} | |")
    elif not args.gpus_only:
        print("| node_exporter | not installed: apt-get install prometheus-node-exporter | |")
    result = {"gpus": args.gpus, "runs": runs, "cpu_ms_per_sample_median": cpu,
              "collect_cpu_ms_median": collect, "rss_mb_median": rss,
              "metrics_render_ms": scrape, "node_exporter_cpu_ms_per_scrape": ne_median,
              "targets": {"cpu_ms_per_sample": TARGET_CPU_MS, "rss_mb": TARGET_RSS_MB}}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
