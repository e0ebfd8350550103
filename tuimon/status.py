"""`tuimon status`: one snapshot of the cluster, or a watch, as text or JSON, with an exit
code a monitoring system understands: 0 ok, 1 warning, 2 critical."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis, Finding, sort_key
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.slo import Slo
from tuimon.model.storage import StorageView
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon_core.protocol.text import clean_lines

EXIT = {"ok": 0, "warning": 1, "critical": 2}


def level(findings: list[Finding]) -> str:
    if any(f.severity == "critical" for f in findings):
        return "critical"
    if any(f.severity == "warning" for f in findings):
        return "warning"
    return "ok"


def report(cluster: ClusterState, eff: EfficiencyView, findings: list[Finding],
           worst_seen: str) -> dict[str, Any]:
    now = eff.now
    counts = cluster.counts()
    hottest = []
    for n in cluster.nodes.values():
        for i, g in enumerate(n.gpu_values()):
            if g.get("temp") is not None:
                hottest.append((g["temp"], f"{n.name} GPU {i}"))
    jobs = {}
    for job in eff.jobs.values():
        sli, throughput = job.window(60, now)
        used = job.burn.consumed_hours if job.burn else 0.0
        burn = job.burn.burn_rates(now) if job.burn else {}
        jobs[job.job] = {"world": job.world, "sli_1m": sli, "samples_per_s": throughput,
                         "budget_hours": eff.slo.budget_hours,
                         "budget_left_hours": eff.slo.remaining_hours(used),
                         "burn_rate_5m": burn.get("5m"), "burn_rate_1h": burn.get("1h"),
                         "stragglers": [f"{s.node} GPU {s.gpu} x{s.ratio:.2f}"
                                        for s in job.stragglers]}
    return {
        "status": worst_seen,
        "nodes": counts,
        "gpus": cluster.gpu_total(),
        "hottest_gpus": [f"{w} {t:.0f}C" for t, w in sorted(hottest, reverse=True)[:3]],
        "proxy_efficiency": None if jobs else eff.proxy,
        "jobs": jobs,
        "alerts": [f.to_json() for f in findings],
    }


def format_text(r: dict[str, Any]) -> str:
    n = r["nodes"]
    lines = [f"{r['status'].upper()}: nodes {n['up']} up / {n['stale']} stale / "
             f"{n['down']} down, {r['gpus']} GPUs; hottest: {', '.join(r['hottest_gpus']) or '-'}"]
    for name, j in r["jobs"].items():
        sli = f"{j['sli_1m']:.2f}" if j["sli_1m"] is not None else "-"
        burn = f"{j['burn_rate_5m']:.1f}x" if j["burn_rate_5m"] is not None else "-"
        lines.append(f"job {name} ({j['world']} ranks): SLI {sli}, "
                     f"{j['samples_per_s'] or 0:,.0f} samples/s, budget "
                     f"{j['budget_left_hours']:.1f} of {j['budget_hours']:.0f} h left, "
                     f"burn {burn}" + (f"; stragglers: {', '.join(j['stragglers'])}"
                                       if j["stragglers"] else ""))
    if not r["jobs"]:
        proxy = r["proxy_efficiency"]
        lines.append("no step telemetry" + (f"; GPU utilization proxy {proxy:.2f}"
                                            if proxy is not None else ""))
    for a in r["alerts"]:
        lines.append(f"{a['severity']:<8} {a['message']}")
    # Names and messages came from the network: nothing raw reaches the terminal.
    return clean_lines("\n".join(lines))


async def run_status(targets: list[str], options: StreamOptions, *, watch: float,
                     relays: list[str] | None = None,
                     topology: dict[str, str], provisioned: dict[str, float], slo: Slo,
                     baselines: dict[str, float], as_json: bool, name: str) -> int:
    cluster = ClusterState(name)
    eff = EfficiencyView(slo, baselines)
    storage = StorageView(provisioned)
    diagnosis = Diagnosis(topology)
    worst = "ok"
    seen: dict[tuple[object, ...], Finding] = {}  # every finding of the watch
    async with watching(targets, cluster, options, relays=relays or []):
        # Two samples from every node (or 5 s) before the first verdict.
        deadline = time.monotonic() + max(5.0, watch)
        first = time.monotonic() + 5.0
        while time.monotonic() < first and not all(
                n.sample is not None and n.sample.seq >= 2 for n in cluster.nodes.values()):
            await asyncio.sleep(0.2)
        while True:
            cluster.refresh_ages()
            storage.update(cluster)
            eff.update(cluster)
            findings = diagnosis.update(cluster, eff, storage)
            for f in findings:
                before = seen.get(f.key)
                seen[f.key] = f if before is None else dataclasses.replace(
                    f, first_seen=before.first_seen)
            now_level = level(findings)
            if EXIT[now_level] > EXIT[worst]:
                worst = now_level
            r = report(cluster, eff, findings, worst if watch else now_level)
            final = not watch or time.monotonic() >= deadline
            if watch and as_json:
                # JSON Lines: one snapshot a second, then the last one with every finding
                # seen during the watch (first and last seen).
                r["time"] = time.time()
                if final:
                    r["final"] = True
                    r["seen"] = [f.to_json() for f in sorted(seen.values(), key=sort_key)]
                print(json.dumps(r), flush=True)
                if final:
                    return EXIT[r["status"]]
            elif final:
                print(json.dumps(r, indent=2) if as_json else format_text(r), flush=True)
                return EXIT[r["status"]]
            elif not as_json:
                print(f"[{time.strftime('%H:%M:%S')}] " + format_text(r).splitlines()[0],
                      flush=True)
            await asyncio.sleep(1.0)
