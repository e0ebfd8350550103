"""Agent cost on a full node: CPU time, system calls, bytes read and Python calls per
sample, and resident memory, beside node_exporter reading the same tree.

Runs the real agent (collectors, sampler, stream server) in a child process on a full
node: 8 fake GPUs on a current driver (the fake pynvml answers in NVML's units, and
answers the PCIe byte counters as drivers from R555 do; everything above it is the
real code) and a temporary /sys and /proc with 8 InfiniBand ports with hw_counters, a
NIC, 4 file systems and 8 disks (bench/node_tree.py), whose counters move twice a
second. It samples at its default 1 s interval, with one stream client (another
process) reading every frame and a /metrics scrape every 15 s. The child reports its
own CPU time, RSS and bytes read (/proc/self/io), so the figures are the agent's alone;
then, in a window of its own (strace slows what it traces), the system calls of all of
its threads per sample (`strace -c -f`, bench/syscalls.py). The Python functions called
per sample are counted in this process (cProfile over the same collectors and frame).

In the same run, node_exporter (if installed) runs on the same tree with the collectors
that read the same files, scraped once a second as Prometheus scrapes it, beside each
agent run: its CPU time (each thread's schedstat), bytes read and scrapes are read at the
moments the agent's child starts and ends its window, so each ratio compares the two
programs over the same seconds (the machine's speed moves from one window to the next:
node_exporter's scrape of this tree took 4.3 ms in one window and 7.2 ms in the next).
It is also measured alone, in a window of its own after the agent's, as earlier runs
measured it; then its system calls per scrape (bench/exporter_beside.py). System calls
and bytes do not move with the machine. Repeated runs; medians are printed. Each run
also measures the full node with no stream client, scraped only, as where Prometheus is
the agent's one reader (it then makes no overview).

    .venv/bin/python bench/agent.py [--runs 3] [--seconds 20] [--interval 1.0]
    .venv/bin/python bench/agent.py --floor   # each program with nothing to read

`--floor` measures what is left of each program on an empty tree (the agent with no GPU,
node_exporter with no file, each taking its paths for a missing file): waking once a
second, serving its reader, its runtime. On the bench VM that is about a third of the
agent's sample of the full node, and of node_exporter's scrape.

Targets: at most half of node_exporter's CPU per scrape and half its system calls per
scrape for the agent's sample of the full node, in one run; at most 3 ms CPU per sample
(2 ms for GPUs alone), at most 60 MB resident.
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
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import syscalls  # noqa: E402  (beside this file; ROOT first: this file is not `agent`)
from exporter_beside import Mark, NodeExporter, binary  # noqa: E402

TARGET_CPU_MS = 3.0
TARGET_RSS_MB = 60.0
TARGET_RATIO = 0.5  # of node_exporter's CPU and system calls per scrape


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _busy_node(gpus: int) -> Any:
    """The fake GPUs of a busy node on the simulator's current driver (NVML's PCIe byte
    counters, past 4 GiB each way, read in the field-values call)."""
    from agent.sim.fake_nvml import FakeGpu, FakeNvml
    from agent.sim.workload import DRIVER  # the simulator's current driver

    return FakeNvml([FakeGpu(i, util_gpu=95, mem_used=70 * 2**30, power_mw=650_000,
                             clock_events=0, procs=[(100 + i, 60 * 2**30)],
                             pcie_tx_bytes=1 << 40, pcie_rx_bytes=1 << 40)
                     for i in range(gpus)], driver_version=DRIVER)


async def _child(seconds: float, interval: float, gpus: int, tree: str,
                 strace_seconds: float, streamed: bool = True) -> dict[str, Any]:
    """The agent alone in this process; the client is the parent process."""
    from aiohttp import web

    from agent.files import FileTree
    from agent.node import AgentConfig, NodeAgent
    from agent.server import build_app

    fake = _busy_node(gpus)
    agent = NodeAgent(AgentConfig(node_name="bench", interval=interval, root=tree),
                      files=FileTree(tree), nvml_loader=lambda: fake)
    runner = web.AppRunner(build_app(agent), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(port, flush=True)
    while streamed and not agent.hub.clients:
        await asyncio.sleep(0.01)
    await asyncio.sleep(1.0)  # warm up: first reads, allocator, caches
    print("measure", flush=True)  # node_exporter beside is marked at these two lines
    io0 = syscalls.read_io(os.getpid())
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    n0 = agent.stats.samples
    await asyncio.sleep(seconds)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    n1 = agent.stats.samples
    print("measured", flush=True)
    io1 = syscalls.read_io(os.getpid())
    samples = max(1, n1 - n0)
    out: dict[str, Any] = {
        "samples": n1 - n0, "rss_mb": _rss_mb(),
        "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
        "collect_cpu_ms": agent.stats.last_sample_cpu * 1000,
        "bytes_read_per_sample": (io1["rchar"] - io0["rchar"]) / samples,
        "read_calls_per_sample": (io1["syscr"] - io0["syscr"]) / samples,
        "dropped": agent.hub.dropped_total}
    if strace_seconds > 0 and syscalls.strace_available():
        def window() -> int:
            s0 = agent.stats.samples
            time.sleep(strace_seconds)
            return agent.stats.samples - s0

        counted = await asyncio.to_thread(syscalls.count_syscalls, os.getpid(), window)
        out["syscalls"] = counted.calls if isinstance(counted, syscalls.SyscallCount) \
            else counted
        out["syscall_samples"] = getattr(counted, "samples", 0)
    await runner.cleanup()
    return out


async def _client(port: int, scrape_every: float) -> int:
    """Read every frame and scrape /metrics as Prometheus would, until the agent goes away.
    It subscribes as today's viewer does (every family, the current overview form), so
    the agent sends the frame it encoded once."""
    import aiohttp

    from tuimon_core.protocol.codec import encode
    from tuimon_core.protocol.messages import Subscribe
    from tuimon_core.protocol.overview_layout import OVERVIEW_FORM

    frames = 0
    async with aiohttp.ClientSession() as s, s.ws_connect(
            f"http://127.0.0.1:{port}/v1/stream") as ws:
        await ws.send_bytes(encode(Subscribe(overview_form=OVERVIEW_FORM)))
        next_scrape = time.monotonic() + scrape_every
        async for _ in ws:
            frames += 1
            if time.monotonic() >= next_scrape:
                next_scrape += scrape_every
                async with s.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    await resp.read()
    return frames


async def _scraper(port: int, scrape_every: float, proc: subprocess.Popen[str]) -> int:
    """Scrape /metrics as Prometheus would, until the agent's process ends; no stream.
    Returns the scrapes answered."""
    import aiohttp

    scrapes = 0
    async with aiohttp.ClientSession() as s:
        next_scrape = time.monotonic() + scrape_every
        while proc.poll() is None:
            await asyncio.sleep(0.2)
            if time.monotonic() >= next_scrape:
                next_scrape += scrape_every
                try:
                    async with s.get(f"http://127.0.0.1:{port}/metrics") as resp:
                        await resp.read()
                    scrapes += 1
                except aiohttp.ClientError:
                    if proc.poll() is None:
                        raise
    return scrapes


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


def _python_calls(gpus: int, tree: Path, n: int = 50) -> float:
    """Python function calls per sample: the collectors, the node's judgement and the
    frame, every one on this thread (the agent runs the collectors in its read worker)."""
    import cProfile
    import pstats
    from concurrent.futures import Executor, Future

    from agent.files import FileTree
    from agent.node import AgentConfig, NodeAgent

    class Inline(Executor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            fut: Future[Any] = Future()
            fut.set_result(fn(*args, **kwargs))
            return fut

    fake = _busy_node(gpus)
    agent = NodeAgent(AgentConfig(node_name="bench", root=str(tree), watch_xid=False),
                      files=FileTree(tree), nvml_loader=lambda: fake, executor=Inline())
    profile = cProfile.Profile()

    async def run() -> None:
        await agent.start(sampling=False)
        for _ in range(3):
            await agent.sample_once()
        profile.enable()
        for _ in range(n):
            await agent.sample_once()
        profile.disable()
        await agent.stop()

    asyncio.run(run())
    return pstats.Stats(profile).total_calls / n  # type: ignore[attr-defined]


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
                    help="only the GPU-only node (8 GPUs and this machine's /proc, no fabric "
                         "or storage tree, no node_exporter); by default it runs beside "
                         "the full node")
    ap.add_argument("--strace-seconds", type=float, default=10.0,
                    help="the window system calls are counted in, apart from the CPU "
                         "window (0: none)")
    ap.add_argument("--scraped-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--floor", action="store_true",
                    help="only the fixed cost: the agent (no GPU) and node_exporter on an "
                         "empty tree, each read as in a run")
    args = ap.parse_args()
    if args.floor:
        _floor(argparse.Namespace(**{**vars(args), "runs": max(1, args.runs)}))
        return
    if args.child:
        print(json.dumps(asyncio.run(_child(args.seconds, args.interval, args.gpus,
                                            args.tree, args.strace_seconds,
                                            not args.scraped_only))))
        return
    import tempfile

    import node_tree

    tree = node_tree.build(Path(tempfile.mkdtemp(prefix="tuimon-bench-")))
    mover = node_tree.Mover(tree)
    mover.start()
    full: list[dict[str, Any]] = []
    gpus_only: list[dict[str, Any]] = []
    scraped: list[dict[str, Any]] = []  # the full node, no stream client: Prometheus alone
    exporter: list[dict[str, Any]] = []
    try:
        for i in range(args.runs):
            line = f"run {i + 1}:"
            if not args.gpus_only:
                ne = NodeExporter(tree, args.interval).start() if binary() else None
                try:
                    if ne is not None:
                        ne.scraping()
                    # Which of the two goes first alternates: the machine drifts in a run.
                    for streamed in (True, False) if i % 2 == 0 else (False, True):
                        (full if streamed else scraped).append(
                            _agent_run(args, tree, streamed, ne))
                    line += (f" agent {full[-1]['cpu_ms_per_sample']:.3f} ms CPU/sample"
                             f" (node_exporter beside {_beside(full[-1])});"
                             f" scraped only {scraped[-1]['cpu_ms_per_sample']:.3f} ms"
                             f" ({_beside(scraped[-1])});")
                    if ne is not None:
                        ne.quiet()
                        alone = ne.alone(args.seconds)
                        exporter.append({**full[-1]["node_exporter"],
                                         "alone_cpu_ms_per_scrape": alone["cpu_ms_per_scrape"],
                                         **ne.syscalls(args.strace_seconds)})
                        line += f" node_exporter alone {alone['cpu_ms_per_scrape']:.3f} ms;"
                finally:
                    if ne is not None:
                        ne.stop()
            gpus_only.append(_agent_run(args, Path("/")))
            line += f" GPUs only {gpus_only[-1]['cpu_ms_per_sample']:.3f} ms CPU/sample"
            print(line, flush=True)
        calls = None if args.gpus_only else _python_calls(args.gpus, tree)
    finally:
        mover.stop()
        node_tree.remove(tree)
    result = _report(args, full, gpus_only, exporter, calls, _scrape_cost(args.gpus), scraped)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


def _floor(args: argparse.Namespace) -> None:
    """What each program costs with nothing to read, the two at the same time as in a run:
    the part of a sample that waking, serving and the runtime cost, whatever the node."""
    import shutil
    import tempfile

    empty = Path(tempfile.mkdtemp(prefix="tuimon-bench-empty-"))
    (empty / "sys").mkdir()
    (empty / "proc").mkdir()
    agent: list[float] = []
    exporter: list[float] = []
    try:
        for i in range(args.runs):
            ne = NodeExporter(empty, args.interval).start() if binary() else None
            try:
                if ne is not None:
                    ne.scraping()
                run = _agent_run(argparse.Namespace(**{**vars(args), "gpus": 0,
                                                       "strace_seconds": 0}), empty, True, ne)
            finally:
                if ne is not None:
                    ne.stop()
            agent.append(run["cpu_ms_per_sample"])
            if "node_exporter" in run:
                exporter.append(run["node_exporter"]["cpu_ms_per_scrape"])
            print(f"run {i + 1}: agent {agent[-1]:.3f} ms CPU/sample"
                  + (f"; node_exporter beside it {exporter[-1]:.3f} ms CPU/scrape"
                     if exporter else ""), flush=True)
    finally:
        shutil.rmtree(empty, ignore_errors=True)
    print(f"nothing to read (medians of {args.runs}): agent {statistics.median(agent):.3f} ms "
          "a sample (a stream client, /metrics every "
          f"{args.scrape_every:g} s)" + (f"; node_exporter {statistics.median(exporter):.3f} ms "
                                          "a scrape" if exporter else ""))


def _agent_run(args: argparse.Namespace, tree: Path, streamed: bool = True,
               beside: NodeExporter | None = None) -> dict[str, Any]:
    """The agent in a child process, read by a stream client and scraped (`streamed`),
    or only scraped, as where Prometheus is its one reader. With `beside` (a
    node_exporter being scraped meanwhile), its cost over the child's own window is
    read too (`node_exporter`), and the ratio of the two (`ratio`)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "--seconds", str(args.seconds),
         "--interval", str(args.interval), "--gpus", str(args.gpus), "--tree", str(tree),
         # System calls are counted on the streamed run only.
         "--strace-seconds", str(args.strace_seconds if streamed else 0),
         *(() if streamed else ("--scraped-only",))],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    lines: list[str] = []
    marks: list[Mark] = []
    failed: list[BaseException] = []

    def follow() -> None:  # the child's window, marked on node_exporter as it opens and ends
        assert proc.stdout is not None
        for text in proc.stdout:
            if text.strip() in ("measure", "measured"):
                if beside is not None and not failed:
                    try:
                        marks.append(beside.mark())
                    except Exception as exc:  # said once the child has ended
                        failed.append(exc)
            else:
                lines.append(text)

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    read = asyncio.run(_client(port, args.scrape_every) if streamed else
                       _scraper(port, args.scrape_every, proc))
    proc.wait()
    reader.join(10)
    if failed:
        raise failed[0]
    r: dict[str, Any] = json.loads("".join(lines).strip().splitlines()[-1])
    r["frames_received" if streamed else "scrapes"] = read
    r["cpu_ms_per_sample"] = 1000 * r["cpu_s"] / max(1, r["samples"])
    if beside is not None:
        if len(marks) != 2:
            raise RuntimeError(f"the agent's child marked {len(marks)} window ends, not 2")
        r["node_exporter"] = NodeExporter.between(*marks)
        r["ratio"] = r["cpu_ms_per_sample"] / r["node_exporter"]["cpu_ms_per_scrape"]
    return r


def _beside(r: dict[str, Any]) -> str:
    ne = r.get("node_exporter")
    return "-" if ne is None else (f"{ne['cpu_ms_per_scrape']:.3f} ms, "
                                   f"ratio {r['ratio']:.2f}")


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def _syscalls(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """Median system calls per sample (or scrape): all, the file calls, and the top ones."""
    counted = [syscalls.SyscallCount(r["syscall_samples"], r["syscalls"]) for r in runs
               if isinstance(r.get("syscalls"), dict)]
    if not counted:
        return None
    out = {"all": statistics.median(c.per_sample(c.total) for c in counted),
           "file": statistics.median(c.per_sample(c.file_calls) for c in counted)}
    names = {name for c in counted for name in c.calls}
    for name in names:
        out[name] = statistics.median(c.per_sample(c.calls.get(name, 0)) for c in counted)
    return out


def _report(args: argparse.Namespace, full: list[dict[str, Any]],
            gpus_only: list[dict[str, Any]], exporter: list[dict[str, Any]],
            calls: float | None, scrape: float,
            scraped: list[dict[str, Any]]) -> dict[str, Any]:
    def fmt(value: float | None, spec: str = ".3f", unit: str = "") -> str:
        return "-" if value is None else format(value, spec) + unit

    agent_sc, ne_sc, gpu_sc = _syscalls(full), _syscalls(exporter), _syscalls(gpus_only)
    cpu = _median(full, "cpu_ms_per_sample")
    ne_cpu = _median(exporter, "cpu_ms_per_scrape")
    ratio = _median(full, "ratio")
    sc_ratio = agent_sc["all"] / ne_sc["all"] if agent_sc and ne_sc else None
    print()
    print(f"| figure ({args.gpus} fake GPUs, 1 stream client, interval {args.interval} s, "
          f"/metrics every {args.scrape_every} s; median of {args.runs}) | tuimon agent, "
          f"full node | node_exporter, same tree | agent, GPUs only | target |")
    print("|---|---|---|---|---|")
    rows = [
        ("CPU per sample (per scrape), whole process, the two side by side",
         fmt(cpu, unit=" ms"),
         fmt(ne_cpu, unit=" ms"), fmt(_median(gpus_only, "cpu_ms_per_sample"), unit=" ms"),
         f"<= {TARGET_RATIO}x node_exporter; <= {TARGET_CPU_MS} ms (GPUs only <= 2 ms)"),
        ("node_exporter's CPU per scrape alone, in a window after the agent's", "",
         fmt(_median(exporter, "alone_cpu_ms_per_scrape"), unit=" ms"), "", ""),
        ("CPU per sample, collectors alone", fmt(_median(full, "collect_cpu_ms"), unit=" ms"),
         "", fmt(_median(gpus_only, "collect_cpu_ms"), unit=" ms"), ""),
        ("system calls per sample (per scrape), all threads",
         fmt(agent_sc and agent_sc["all"], ".0f"), fmt(ne_sc and ne_sc["all"], ".0f"),
         fmt(gpu_sc and gpu_sc["all"], ".0f"), f"<= {TARGET_RATIO}x node_exporter"),
        ("of which on files (open, read, list, stat, close)",
         fmt(agent_sc and agent_sc["file"], ".0f"), fmt(ne_sc and ne_sc["file"], ".0f"),
         fmt(gpu_sc and gpu_sc["file"], ".0f"), ""),
        ("bytes read per sample (per scrape)",
         fmt(_median(full, "bytes_read_per_sample"), ".0f"),
         fmt(_median(exporter, "bytes_read_per_scrape"), ".0f"),
         fmt(_median(gpus_only, "bytes_read_per_sample"), ".0f"), ""),
        ("Python function calls per sample", fmt(calls, ".0f"), "", "", ""),
        ("resident memory", fmt(_median(full, "rss_mb"), ".1f", " MB"), "",
         fmt(_median(gpus_only, "rss_mb"), ".1f", " MB"), f"<= {TARGET_RSS_MB} MB"),
        ("one /metrics render (CPU)", fmt(scrape, ".2f", " ms"), "", "", ""),
        ("ratio agent / node_exporter: CPU over the same seconds (median of the runs' "
         "ratios)", fmt(ratio, ".2f"),
         "", "", f"<= {TARGET_RATIO}"),
        ("ratio agent / node_exporter: system calls", fmt(sc_ratio, ".2f"), "", "",
         f"<= {TARGET_RATIO}"),
        ("the full node with no stream client (Prometheus its one reader): CPU per "
         "sample; ratio", f"{fmt(_median(scraped, 'cpu_ms_per_sample'), unit=' ms')}; "
         f"{fmt(_median(scraped, 'ratio'), '.2f')}", "", "", ""),
    ]
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if agent_sc and ne_sc:
        def top(sc: dict[str, float]) -> str:
            ranked = sorted(((k, v) for k, v in sc.items() if k not in ("all", "file")),
                            key=lambda kv: -kv[1])[:8]
            return ", ".join(f"{k} {v:.0f}" for k, v in ranked)
        print(f"\nagent's calls per sample: {top(agent_sc)}")
        print(f"node_exporter's per scrape: {top(ne_sc)}")
    if not exporter and not args.gpus_only:
        print("node_exporter not installed: apt-get install prometheus-node-exporter")
    return {"gpus": args.gpus, "runs": full, "gpus_only_runs": gpus_only,
            "node_exporter_runs": exporter,
            "cpu_ms_per_sample_median": cpu,
            "collect_cpu_ms_median": _median(full, "collect_cpu_ms"),
            "rss_mb_median": _median(full, "rss_mb"),
            "gpus_only_cpu_ms_per_sample_median": _median(gpus_only, "cpu_ms_per_sample"),
            "metrics_render_ms": scrape, "node_exporter_cpu_ms_per_scrape": ne_cpu,
            "node_exporter_alone_cpu_ms_per_scrape": _median(exporter,
                                                             "alone_cpu_ms_per_scrape"),
            "ratio_cpu": ratio, "ratio_syscalls": sc_ratio, "scraped_only_runs": scraped,
            "scraped_only_cpu_ms_per_sample_median": _median(scraped, "cpu_ms_per_sample"),
            "scraped_only_ratio_cpu": _median(scraped, "ratio"),
            "syscalls_per_sample": agent_sc, "node_exporter_syscalls_per_scrape": ne_sc,
            "python_calls_per_sample": calls,
            "targets": {"cpu_ms_per_sample": TARGET_CPU_MS, "rss_mb": TARGET_RSS_MB,
                        "ratio": TARGET_RATIO}}


if __name__ == "__main__":
    main()
