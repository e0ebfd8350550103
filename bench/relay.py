"""The relay under load: N agents at 1 Hz in, V viewers out.

Three processes, so each cost is measured alone:
  - the replay server (bench/replay_server.py): N node endpoints at 1 Hz, each frame
    stamped with `ts` just before it is sent;
  - the relay, `tuimon relay` exactly as an admin runs it, with its SQLite ledger,
    batching to each viewer every 0.25 s (its default);
  - this process: V viewers on real websockets, each receiving every node's frames in
    batches and reading, for every 8th frame, the sample's `ts`: arrival minus `ts` is
    the time the relay added (the replay server and the viewers share this loopback, so
    the direct path costs about a millisecond of it).

The relay's CPU comes from /proc/PID/stat over the measured window, its memory from
VmRSS at the end (and VmHWM, the peak).

    .venv/bin/python bench/relay.py [--nodes 1024] [--viewers 10] [--seconds 30]

Viewers ask for each node's overview, as the app does (`--full-frames`: every family, as
viewers did before overviews); the relay then asks each agent only for that.

The relay judges every node it carries (its findings, with a topology of 32 nodes a
leaf: tuimon/relay/judging.py); `RELAY_ROOT=DIR` runs another checkout's relay instead,
for a before-and-after in one sitting.

Targets: 1024 agents, 10 viewers: at most 50 % of one core (issue #6); 4096 agents at
most 40 % (issue #12), judging with a topology too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


async def viewer(url: str, stop: float, warm: float, latencies: list[float],
                 counts: list[int], full: bool = False) -> None:
    import aiohttp
    import msgpack

    from tuimon_core.overview import OVERVIEW_FAMILIES
    from tuimon_core.protocol import Subscribe, encode
    from tuimon_core.protocol.overview_layout import OVERVIEW_FORM

    async with aiohttp.ClientSession() as session, session.ws_connect(
            url, max_msg_size=16 << 20) as ws:
        if not full:  # as the app asks: each node's overview
            await ws.send_bytes(encode(Subscribe(families=list(OVERVIEW_FAMILIES),
                                                       overview_form=OVERVIEW_FORM)))
        n = 0
        while time.monotonic() < stop:
            try:
                msg = await ws.receive(timeout=max(0.1, stop - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if msg.type != aiohttp.WSMsgType.BINARY:
                break
            now = time.time()
            batch = msgpack.unpackb(msg.data, raw=False)
            measuring = time.monotonic() >= warm
            for _, data in batch.get("frames", []):
                n += 1
                if measuring and n % 8 == 0:
                    frame = msgpack.unpackb(data, raw=False)
                    if frame.get("t") == "sample":
                        latencies.append(now - frame["ts"])
            if measuring:
                counts[0] += len(batch.get("frames", []))
                counts[1] += len(msg.data)


async def _viewers(url: str, count: int, seconds: float,
                   warmup: float, full: bool) -> tuple[list[float], list[int]]:
    latencies: list[float] = []
    counts = [0, 0]  # frames, bytes
    start = time.monotonic()
    await asyncio.gather(*(viewer(url, start + warmup + seconds, start + warmup, latencies,
                                  counts, full) for _ in range(count)))
    return latencies, counts


def topology_conf(nodes: int, per_leaf: int = 32) -> str:
    """A Slurm topology.conf of the replay server's nodes (`bench00000`...), 32 a leaf,
    for the relay to judge congestion by leaf and spine with."""
    lines = []
    for leaf, first in enumerate(range(0, nodes, per_leaf)):
        last = min(nodes, first + per_leaf) - 1
        lines.append(f"SwitchName=leaf{leaf:03d} Nodes=bench[{first:05d}-{last:05d}]")
    return "\n".join(lines) + "\n"


def _judgement(port: int) -> dict[str, float]:
    """What the relay's /healthz says of its judgement (empty for a relay without)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
        return json.loads(r.read()).get("judgement") or {}


def measure(nodes: int, viewers: int, seconds: float, warmup: float,
            base_port: int, relay_port: int, full: bool = False) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="tuimon-relay-bench-"))
    ready = tmp / "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, str(ROOT / "bench" / "replay_server.py"),
                               str(nodes), "--base-port", str(base_port), "--ready",
                               str(ready)], env=env, cwd=ROOT)
    relay = None
    try:
        while not ready.exists():
            if server.poll() is not None:
                raise RuntimeError("replay server failed")
            time.sleep(0.1)
        targets = tmp / "targets"
        targets.write_text("".join(f"127.0.0.1:{base_port + i}\n" for i in range(nodes)))
        # TUIMON_BENCH_PROFILE=FILE: the relay runs under cProfile, written at exit.
        profile = os.environ.get("TUIMON_BENCH_PROFILE")
        prefix = ["-m", "cProfile", "-o", profile] if profile else []
        conf = tmp / "topology.conf"
        conf.write_text(topology_conf(nodes))
        # RELAY_ROOT: another checkout's relay (a before-and-after in one sitting).
        where = Path(os.environ.get("RELAY_ROOT", ROOT))
        judged = ["--topology", str(conf)] if (where / "tuimon/relay/judging.py").exists() \
            else []
        relay = subprocess.Popen(
            [sys.executable, *prefix, "-m", "tuimon.cli", "relay", "--targets-file", str(targets),
             "--listen", f"127.0.0.1:{relay_port}", "--ledger", str(tmp / "ledger.db"),
             "--log-level", "warning", *judged], env={**env, "PYTHONPATH": str(where)},
            cwd=where)
        time.sleep(3.0)
        url = f"http://127.0.0.1:{relay_port}/v1/stream"
        cpu_box: dict[str, float] = {}

        async def run() -> tuple[list[float], list[int]]:
            task = asyncio.create_task(_viewers(url, viewers, seconds, warmup, full))
            await asyncio.sleep(warmup)
            cpu_box["cpu0"], cpu_box["t0"] = cpu_seconds(relay.pid), time.monotonic()
            result = await task
            cpu_box["cpu1"], cpu_box["t1"] = cpu_seconds(relay.pid), time.monotonic()
            return result
        latencies, (frames, received) = asyncio.run(run())
        mem = memory_kib(relay.pid)
        judgement = _judgement(relay_port)
        window = cpu_box["t1"] - cpu_box["t0"]
        lat = sorted(latencies)
        return {
            "nodes": nodes, "viewers": viewers,
            "relay_cpu_share": (cpu_box["cpu1"] - cpu_box["cpu0"]) / window,
            "relay_rss_mib": mem.get("VmRSS", 0) / 1024,
            "relay_peak_rss_mib": mem.get("VmHWM", 0) / 1024,
            "latency_p50": lat[len(lat) // 2] if lat else float("nan"),
            "latency_p95": lat[int(len(lat) * 0.95)] if lat else float("nan"),
            "frames_per_viewer_per_s": frames / viewers / seconds,
            # What a viewer's link carries: relay to viewer, batches and all.
            "bytes_per_node_per_s": received / viewers / seconds / nodes,
            # The last judgement pass (a relay that judges: its /healthz says), NaN before.
            "judgement_ms": 1000 * judgement.get("seconds", float("nan")),
            "findings": judgement.get("findings", float("nan")),
        }
    finally:
        for proc in (relay, server):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1024])
    ap.add_argument("--viewers", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--base-port", type=int, default=23000)
    ap.add_argument("--relay-port", type=int, default=22999)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--full-frames", action="store_true",
                    help="viewers take every family of every node (as before overviews)")
    args = ap.parse_args()
    rows = []
    for n in args.nodes:
        runs = [measure(n, args.viewers, args.seconds, args.warmup, args.base_port,
                        args.relay_port, args.full_frames) for _ in range(args.runs)]
        r = {k: sorted(run[k] for run in runs)[len(runs) // 2] for k in runs[0]}
        rows.append(r)
        print(f"{n} agents -> relay -> {args.viewers} viewers: relay CPU "
              f"{100 * r['relay_cpu_share']:.1f} % of a core, RSS {r['relay_rss_mib']:.0f} MiB "
              f"(peak {r['relay_peak_rss_mib']:.0f}), added latency p50 "
              f"{r['latency_p50']:.2f} s p95 {r['latency_p95']:.2f} s, "
              f"{r['frames_per_viewer_per_s']:.0f} frames/s per viewer, "
              f"{r['bytes_per_node_per_s']:.0f} bytes/node/s to each viewer; judgement "
              f"{r['judgement_ms']:.0f} ms a pass, {r['findings']:.0f} findings", flush=True)
    print("targets: 1024 agents and 10 viewers <= 50 % of one core; 4096 agents <= 40 %")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
