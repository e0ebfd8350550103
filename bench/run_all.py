"""`make bench`: every benchmark, one table of each figure against its target.

Runs each benchmark in its own process (agent, wire, reporter, relay, app direct and
through a relay at growing sizes, the app through a tree of relays), each of which
repeats its measurement and reports medians, then writes bench/results/latest.md and
latest.json with the machine it ran on. Ratios (agent against node_exporter, frame
decode against Prometheus text parse) are measured side by side in the same run. A row
per size shows how each cost grows.

    .venv/bin/python bench/run_all.py [--quick]

`--quick` runs shorter and smaller (a smoke test of the benchmarks, not figures to quote).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def _run(script: str, *args: str) -> Any:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [sys.executable, str(BENCH / script), *args, "--json", str(out)]
    print("$", " ".join(cmd[1:]), flush=True)
    started = time.monotonic()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
    try:
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def _row(group: str, figure: str, value: float | None, unit: str, fmt: str,
         target: str = "", met: bool | None = None) -> dict[str, Any]:
    return {"group": group, "figure": figure, "value": value, "unit": unit,
            "text": "-" if value is None else format(value, fmt) + (f" {unit}" if unit else ""),
            "target": target, "met": met}


def collect(quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    secs = "6" if quick else "20"
    runs = "1" if quick else "3"

    a = _run("agent.py", "--runs", runs, "--seconds", secs, "--strace-seconds",
             "4" if quick else "10")
    cpu = a["cpu_ms_per_sample_median"]
    rows.append(_row("agent, full node", "CPU per 1 Hz sample", cpu, "ms", ".2f", "<= 3 ms",
                     cpu <= 3.0))
    rows.append(_row("agent, full node", "resident memory", a["rss_mb_median"], "MB", ".1f",
                     "<= 60 MB", a["rss_mb_median"] <= 60))
    ne = a.get("node_exporter_cpu_ms_per_scrape")
    rows.append(_row("agent, full node", "node_exporter on the same tree, CPU per scrape, "
                     "over the agent's seconds", ne, "ms", ".2f"))
    rows.append(_row("agent, full node", "node_exporter alone, CPU per scrape",
                     a.get("node_exporter_alone_cpu_ms_per_scrape"), "ms", ".2f"))
    for figure, key in (("ratio agent / node_exporter, CPU over the same seconds", "ratio_cpu"),
                        ("ratio agent / node_exporter, system calls", "ratio_syscalls")):
        ratio = a.get(key)
        rows.append(_row("agent, full node", figure, ratio, "", ".2f", "<= 0.5",
                         None if ratio is None else ratio <= 0.5))
    scraped = a.get("scraped_only_ratio_cpu")
    rows.append(_row("agent, full node", "ratio agent with no stream client (Prometheus its "
                     "one reader) / node_exporter, CPU", scraped, "", ".2f", "<= 0.5",
                     None if scraped is None else scraped <= 0.5))
    calls = a.get("syscalls_per_sample") or {}
    rows.append(_row("agent, full node", "system calls per sample", calls.get("all"), "",
                     ".0f"))
    rows.append(_row("agent, full node", "Python function calls per sample",
                     a.get("python_calls_per_sample"), "", ".0f"))
    gpus_only = a["gpus_only_cpu_ms_per_sample_median"]
    rows.append(_row("agent, 8 GPUs only", "CPU per 1 Hz sample", gpus_only, "ms", ".2f",
                     "<= 2 ms", gpus_only <= 2.0))

    w = _run("wire.py", "--runs", "3" if quick else "5",
             "--iterations", "200" if quick else "2000")
    rows.append(_row("wire, one full node", "frame bytes", w["frame_bytes"], "B", ".0f"))
    rows.append(_row("wire, one full node", "encode", w["encode_us"], "us", ".0f"))
    rows.append(_row("wire, one full node", "decode, all checks (viewer)", w["decode_us"], "us",
                     ".0f"))
    rows.append(_row("wire, one full node", "decode, envelope (relay)",
                     w["decode_envelope_us"], "us", ".0f"))
    rows.append(_row("wire, one full node", "Prometheus text of the same node, bytes",
                     w["prom_text_bytes"], "B", ".0f"))
    rows.append(_row("wire, one full node", "Prometheus text parse (prometheus_client)",
                     w["prom_parse_us"], "us", ".0f"))
    rows.append(_row("wire, one full node", "ratio text parse / frame decode",
                     w["parse_ratio_prom_over_decode"], "x", ".1f"))

    r = _run("reporter.py", "--runs", runs, "--steps", "20000" if quick else "200000")
    rows.append(_row("step reporter", "per step, agent listening", r["live_us"], "us", ".1f"))

    sizes = ["256"] if quick else ["256", "1024", "4096"]
    for rr in _run("relay.py", "--nodes", *sizes, "--seconds", secs, "--warmup",
                   "6" if quick else "10"):
        n = rr["nodes"]
        group = f"relay, {n} agents -> {rr['viewers']} overview viewers"
        limit = 50 if n == 1024 else 40 if n == 4096 else None
        share = 100 * rr["relay_cpu_share"]
        rows.append(_row(group, "relay CPU, one core", share, "%", ".1f",
                         f"<= {limit} %" if limit else "",
                         share <= limit if limit else None))
        rows.append(_row(group, "bytes per node per second to a viewer",
                         rr["bytes_per_node_per_s"], "B", ".0f"))
        rows.append(_row(group, "relay resident memory", rr["relay_rss_mib"], "MiB", ".0f"))
        rows.append(_row(group, "relay resident memory, peak", rr["relay_peak_rss_mib"], "MiB",
                         ".0f"))
        rows.append(_row(group, "latency added, p95", rr["latency_p95"], "s", ".2f"))

    sizes = ["256"] if quick else ["256", "1024", "4096"]
    for t in _run("tui.py", "--nodes", *sizes, "--via", "both", "--seconds", secs,
                  "--warmup", "8" if quick else "15"):
        n, via = t["nodes"], t["via"]
        group = f"app, {n} nodes x 8 GPUs, {via}"
        share = 100 * t["cpu_share"]
        # A CPU figure only counts if the app kept up: an app (or relay) that falls
        # behind shows fewer samples and spends less.
        shown = t["samples_per_node_s"]
        limit = 20 if (n == 1024 and via == "direct") or (n == 4096 and via == "relay") \
            else None
        rows.append(_row(group, "app CPU, one core", share, "%", ".1f",
                         f"<= {limit} %" if limit else "",
                         (share <= limit and shown >= 0.9) if limit else None))
        rows.append(_row(group, "machine speed then: us to decode an overview frame",
                         t["decode_us"], "us", ".1f"))
        rows.append(_row(group, "samples shown per node per second (1 Hz sent)", shown, "",
                         ".2f", ">= 0.9", shown >= 0.9))
        rows.append(_row(group, "sample to screen, p95", t["latency_p95"], "s", ".2f",
                         "<= 1.5 s", t["latency_p95"] <= 1.5))
        rows.append(_row(group, "terminal output", t["terminal_bytes_per_s"] / 1024, "KiB/s",
                         ".1f"))

    # `tuimon prom` on a real Prometheus (skipped where none is installed). At 4096 nodes
    # two cores cannot carry the server's ingest every 5 s beside the app: it scrapes
    # every 15 s there (the app still refreshes every 5 s).
    if shutil.which("prometheus"):
        # At 1024 nodes every layout of the fleet (bench/prom_fleet.py): one target a node,
        # one target for all with labels naming the nodes, nodes with one exporter only.
        for size, scrape, layouts in [("64", "5", ["instance", "labels"])] if quick else [
                ("1024", "5", ["instance", "labels", "mixed"]), ("4096", "15", ["instance"])]:
            for p in _run("prom.py", "--nodes", size, "--seconds", secs, "--scrape", scrape,
                          "--warmup", "8" if quick else "30", "--layout", *layouts):
                n = p["nodes"]
                group = (f"tuimon prom, {n} nodes x 8 GPUs ({p['layout']} layout), "
                         f"Prometheus every {scrape} s")
                share = 100 * p["app_cpu_share"]
                limit = 5 if n == 1024 else 15 if n == 4096 else None
                rows.append(_row(group, "app CPU at a 5 s refresh, one core", share, "%", ".1f",
                                 f"<= {limit} %" if limit else "",
                                 share <= limit if limit else None))
                rows.append(_row(group, "--once, wall", p["once_wall_s"], "s", ".1f",
                                 "<= 3 s", p["once_wall_s"] <= 3))
                rows.append(_row(group, "refresh on screen after its query, p95",
                                 p["on_screen_p95"], "s", ".2f", "<= 2 s",
                                 p["on_screen_p95"] <= 2))
                rows.append(_row(group, "bytes read per refresh",
                                 p["bytes_per_refresh"] / 1e6, "MB", ".1f"))
                rows.append(_row(group, "the server's CPU, beside it",
                                 100 * p["server_cpu_share"], "%", ".0f"))
        # The same app on answers Prometheus gave, recorded and replayed: no server's
        # ingest beside it on the two cores, so a figure that moves with the code more
        # than with the machine (bench/prom_replay.py). 250 ms a refresh is 5 % of a
        # core at a 5 s refresh.
        size = "64" if quick else "1024"
        for layout in ("instance", "labels"):
            with tempfile.TemporaryDirectory(prefix="tuimon-replay-") as tmp:
                answers = Path(tmp) / "answers.json.gz"
                cmd = [sys.executable, str(BENCH / "prom_replay.py"), "record", str(answers),
                       "--nodes", size, "--layout", layout,
                       "--seconds", "20" if quick else "60"]
                print("$", " ".join(cmd[1:]), flush=True)
                subprocess.run(cmd, check=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
                r = _run("prom_replay.py", "replay", str(answers),
                         "--refreshes", "10" if quick else "30")
            rows.append(_row(f"tuimon prom, {r['nodes']} nodes x 8 GPUs ({r['layout']} "
                             "layout), recorded answers replayed",
                             "app CPU per refresh (250 ms: 5 % of a core at 5 s)",
                             1000 * r["cpu_s_per_refresh"], "ms", ".0f"))

    # 16,384 nodes through four relays and a top relay. Two cores cannot carry 16,384
    # agents' frames at 1 Hz besides five relays and the app, so the replayed nodes send
    # at a quarter of that; each relay's CPU per node-sample makes the extrapolation.
    n, rate = ("1024", "0.25") if quick else ("16384", "0.25")
    t = _run("tui.py", "--nodes", n, "--via", "tree", "--rate", rate, "--seconds", secs,
             "--warmup", "15" if quick else "30", "--base-port", "2100")[0]
    group = f"tree, {n} nodes -> 4 relays -> top relay -> app, {rate} Hz"
    rows.append(_row(group, "app CPU, one core", 100 * t["cpu_share"], "%", ".1f"))
    rows.append(_row(group, "machine speed then: us to decode an overview frame",
                     t["decode_us"], "us", ".1f"))
    rows.append(_row(group, "samples shown, of those sent", 100 * t["shown_of_sent"], "%",
                     ".0f", ">= 90 %", t["shown_of_sent"] >= 0.9))
    rows.append(_row(group, "sample to screen, p95", t["latency_p95"], "s", ".2f", "<= 2 s",
                     t["latency_p95"] <= 2.0))
    for name, o in t["others"].items():
        if "relay" not in name:
            continue
        per = int(n) // 4 if name != "top relay" else int(n)
        rows.append(_row(group, f"{name}: CPU, one core", 100 * o["cpu_share"], "%", ".1f"))
        rows.append(_row(group, f"{name}: resident memory", o["rss_mib"], "MiB", ".0f"))
        # Relay CPU is per frame: at 1 Hz its nodes send 1/rate times as many.
        rows.append(_row(group, f"{name}: CPU per 4096 nodes at 1 Hz (extrapolated)",
                         100 * o["cpu_share"] / per * 4096 / float(rate), "%", ".0f"))
    return rows


def markdown(rows: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    out = [f"# tuimon benchmarks, {machine['date']}", "",
           f"Machine: {machine['cpus']} CPUs ({machine['cpu']}), Python {machine['python']}, "
           f"{machine['platform']}. Medians of repeated runs; see each script's docstring.",
           "", "| group | figure | measured | target | met |", "|---|---|---|---|---|"]
    for r in rows:
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        out.append(f"| {r['group']} | {r['figure']} | {r['text']} | {r['target']} | {met} |")
    return "\n".join(out) + "\n"


def _machine() -> dict[str, Any]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
            "cpu": cpu, "python": platform.python_version(), "platform": platform.platform()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(BENCH / "results"), metavar="DIR")
    args = ap.parse_args()
    rows = collect(args.quick)
    machine = _machine()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, machine)
    (out / "latest.md").write_text(text)
    (out / "latest.json").write_text(json.dumps({"machine": machine, "quick": args.quick,
                                                 "rows": rows}, indent=2))
    print()
    print(text)
    print(f"written: {out / 'latest.md'}, {out / 'latest.json'}")


if __name__ == "__main__":
    main()
