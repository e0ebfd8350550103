"""`tuimon status`: one snapshot of the cluster, or a watch, as text or JSON, with an exit
code a monitoring system understands (Nagios' convention): 0 ok, 1 warning, 2 critical,
3 unknown (no node could be reached at all, or the check itself failed: an internal
error in a part of the judgement, said in the output, makes a verdict short of critical
unknown).

A one-shot status waits for what it needs before it judges: two samples from every node
that answers (or that node's failure); from every node that reports training steps,
step sums twice; then, while a condition is being held before it shows (a finding the
cluster rules raise only after it lasts a few seconds), until it is raised or gone.
Each wait is bounded (tuimon.snapshot_waits, said in `--help`). Nodes never reached by then count as
down, with the reason."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Finding, gpus_unseen, sort_key, unreached
from tuimon.model.efficiency import WINDOWS, EfficiencyView
from tuimon.model.finding_groups import group
from tuimon.model.job_report import job_report
from tuimon.model.judge_config import JudgeConfig
from tuimon.model.judgement import Judgement
from tuimon.model.slo import coverage_text
from tuimon.snapshot_waits import (
    FIRST_VERDICT_S,
    HOLD_WAIT_S,
    RELAY_JUDGEMENT_S,
    STEPS_WAIT_S,
)
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon.text.incident_text import incident_lines
from tuimon.text.job_text import job_text
from tuimon_core import json_text
from tuimon_core.hostlist import paste_hostlist
from tuimon_core.node_states import CONNECTING, DOWN, STALE, UNKNOWN, UP
from tuimon_core.protocol.text import clean_lines
from tuimon_core.wait_kinds import missed_text, said, said_hours
from tuimon_core.wording import duration_text, held_text, onset_text, plural

EXIT = {"ok": 0, "warning": 1, "critical": 2, "unknown": 3}


def level(findings: list[Finding]) -> str:
    if any(f.severity == "critical" for f in findings):
        return "critical"
    if any(f.severity == "warning" for f in findings):
        return "warning"
    return "ok"


def verdict(cluster: ClusterState, findings: list[Finding]) -> str:
    """The check's verdict: the gravest finding's level, but unknown where no node was
    reached at all (no verdict is possible) or part of the check failed and nothing
    critical was found (its verdict is partial). status, --once and the readout's line
    all say this one."""
    now_level = level(findings)
    if not any(n.last_seen is not None for n in cluster.nodes.values()):
        return "unknown"
    if now_level != "critical" and any(f.kind == "internal_error" for f in findings):
        return "unknown"
    return now_level


def snapshot_findings(judge: Judgement, cluster: ClusterState, final: bool) -> list[Finding]:
    """The judgement now, and at the end of a snapshot the nodes never reached."""
    return judge.update() + _unreached(cluster, final)


def report(cluster: ClusterState, eff: EfficiencyView, findings: list[Finding],
           worst_seen: str) -> dict[str, Any]:
    now = eff.now
    # Down means lost: a node never reached is counted apart (connecting or refused).
    counts = {UP: 0, STALE: 0, DOWN: 0, UNKNOWN: 0, "unreached": 0}
    for n in cluster.nodes.values():
        counts["unreached" if n.last_seen is None else n.status] += 1
    hottest = []
    for n in cluster.nodes.values():
        for i, g in enumerate(n.gpu_values()):
            if g.get("temp") is not None:
                hottest.append((g["temp"], f"{n.name} GPU {i}"))
    jobs = {}
    for job in eff.jobs.values():
        sli, sli_seen = job.sli_window(WINDOWS["1m"], now)  # as the strip says it
        throughput = job.throughput(WINDOWS["1m"], now)
        used = job.burn.consumed_hours if job.burn else 0.0
        burn = job.burn.burn_rates(now) if job.burn else {}
        verdict = job.verdict(now)
        firing = verdict.firing
        age = verdict.steps_age
        waited, wait_kinds = job.wait_shares(3600, now)
        versus = eff.efficiency(job, throughput)
        jobs[job.job] = {"world": job.world, "sli_1m": sli, "samples_per_s": throughput,
                         "sli_1m_covered_s": round(sli_seen, 1),
                         # What the step time went to waiting on over the last hour
                         # (shares of the step time): the budget's loss, by its cause.
                         "waiting_1h": round(waited, 4),
                         # Against one GPU's throughput (--baseline), else the job's best.
                         "efficiency": None if versus is None else round(versus[0], 4),
                         "efficiency_against": None if versus is None else versus[1],
                         "waits_1h": {k: round(v, 4) for k, v in wait_kinds.items()
                                      if round(v, 4) > 0},
                         "verdict": verdict.state,
                         "ranks_reporting": verdict.reporting,
                         "steps_age_s": None if age is None else round(age, 1),
                         # While every rank is silent (the relay's ledger): what held.
                         "stopped_cause": verdict.cause,
                         "budget_hours": eff.slo.budget_hours,
                         "budget_left_hours": eff.slo.remaining_hours(used),
                         "budget_recovered_hours": getattr(job.burn, "recovered_hours", 0.0),
                         # What of it was lost, by the kinds the ranks' totals named.
                         "budget_recovered_spent_hours": getattr(
                             job.burn, "recovered_spent_hours", {}),
                         # What the consumed budget was spent waiting on, by kind.
                         "budget_spent_hours": {k: round(v, 6) for k, v in
                                                (job.burn.spent_hours if job.burn
                                                 else {}).items() if round(v, 6) > 0},
                         "burn_rate_5m": burn.get("5m"), "burn_rate_1h": burn.get("1h"),
                         "burn_rates": burn,
                         # Seconds of each burn window the data covers (None: unknown):
                         # an alert needs most of its short window (slo.COVERED_TO_ALERT).
                         "burn_covered_s": ({w: None if s is None else round(s, 1)
                                             for w, s in job.burn.coverage(now).items()}
                                            if job.burn else {}),
                         "burn": job.burn.text(now) if job.burn else "-",
                         "burn_alert": ({"severity": firing[0][0], "long": firing[0][1],
                                         "short": firing[0][2], "threshold": firing[0][3]}
                                        if firing else None),
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
        # The same findings grouped for a person, as the app's diagnosis pane shows them.
        "summary": [{"severity": g.severity, "text": g.text, "since": g.since,
                     # Its nodes as one host list to paste (pdsh, scontrol, the filter).
                     "hosts": paste_hostlist(g.nodes)[0] or None}
                    for g in group(findings)],
    }


def format_text(r: dict[str, Any]) -> str:
    n = r["nodes"]
    extra = (f" / {n[UNKNOWN]} unknown" if n.get(UNKNOWN) else "") + (
        f" / {n['unreached']} never reached" if n.get("unreached") else "")
    lines = [f"{r['status'].upper()}: nodes {n[UP]} up / {n[STALE]} stale / "
             f"{n[DOWN]} down{extra}, {r['gpus']} GPUs; hottest: "
             f"{', '.join(r['hottest_gpus']) or '-'}"]
    for name, j in r["jobs"].items():
        sli = (f"{j['sli_1m']:.2f}"
               + coverage_text(j.get("sli_1m_covered_s"), "1m", WINDOWS["1m"])
               if j["sli_1m"] is not None else "-")
        burn = j["burn"]
        ranks = (f"{j['ranks_reporting']} of {j['world']} ranks reporting"
                 if j["ranks_reporting"] < j["world"] else plural(j["world"], "rank"))
        stale = (f", no step reports for {j['steps_age_s']:.0f} s"
                 if j["verdict"] == "stale" else
                 f", STOPPED {duration_text(j['steps_age_s'] or 0)} ago: "
                 f"{j.get('stopped_cause') or 'no finding'}"
                 if j["verdict"] == "stopped" else "")
        rate = f"{j['samples_per_s']:,.0f} samples/s" if j["samples_per_s"] else "- samples/s"
        missed = missed_text(j.get("budget_recovered_hours") or 0.0,
                             j.get("budget_recovered_spent_hours"))
        recovered = f" ({missed})" if j.get("budget_recovered_hours") else ""
        waits = said(j.get("waits_1h") or {})
        waits = f", waiting 1h: {waits}" if waits else ""
        if j.get("efficiency") is not None:
            against = j["efficiency_against"]
            waits += (f", scaling efficiency {j['efficiency']:.2f}" if against == "baseline"
                      else f", efficiency {j['efficiency']:.2f} vs {against}")
        spent = said_hours(j.get("budget_spent_hours") or {})
        spent = f" (spent on {spent})" if spent else ""
        lines.append(f"job {name} ({ranks}{stale}): SLI {sli}{waits}, {rate}, budget "
                     f"{j['budget_left_hours']:.1f} of {j['budget_hours']:.0f} h left"
                     f"{spent}{recovered}, "
                     f"burn {burn}" + (f"; stragglers: {', '.join(j['stragglers'])}"
                                       if j["stragglers"] else ""))
    if not r["jobs"]:
        proxy = r["proxy_efficiency"]
        lines.append("no step telemetry" + (f"; GPU busy proxy {proxy:.2f}"
                                            if proxy is not None else ""))
    now = time.time()
    for g in r["summary"]:
        lines.append(f"{g['severity']:<8} {held_text(g['text'], g.get('since'), now)}")
    # Names and messages came from the network: nothing raw reaches the terminal.
    return clean_lines("\n".join(lines))


async def run_status(targets: list[str], options: StreamOptions, *, watch: float,
                     relays: list[str] | None = None, config: JudgeConfig, as_json: bool,
                     name: str,
                     feed: Callable[[ClusterState], AbstractAsyncContextManager[Any]] | None
                     = None, job: str | None = None) -> int:
    """`config`: what the cluster is judged with (the model builds the judgement).
    `feed`: how the model is kept up to date (Prometheus); else the agents and relays
    given, watched directly. `job`: print that job's document (its screen's) instead of
    the cluster's; the exit code is the cluster's all the same."""
    cluster = ClusterState(name)
    judge = config.judgement(cluster)
    eff = judge.efficiency
    worst = "ok"
    seen: dict[tuple[object, ...], Finding] = {}  # every finding of the watch
    source = (feed(cluster) if feed is not None else
              watching(targets, cluster, options, relays=relays or []))
    async with source:
        deadline = time.monotonic() + max(FIRST_VERDICT_S, watch)
        await first_samples(cluster, eff, judge.diagnosis.cpu_nodes)
        if relays and not targets:
            await relay_judgement(cluster)
        if not watch and cluster.relayed_findings() is None:
            await settle(judge)  # (a relay's findings come held from their onsets)
        while True:
            final = not watch or time.monotonic() >= deadline
            findings = snapshot_findings(judge, cluster, final)
            for f in findings:
                before = seen.get(f.key)
                seen[f.key] = f if before is None else dataclasses.replace(
                    f, first_seen=before.first_seen)
            now_level = verdict(cluster, findings)
            if EXIT[now_level] > EXIT[worst]:
                worst = now_level
            r = report(cluster, eff, findings, worst if watch else now_level)
            if watch and as_json:
                # JSON Lines: one snapshot a second, then the last one with every finding
                # seen during the watch (first and last seen).
                r["time"] = time.time()
                if final:
                    r["final"] = True
                    r["seen"] = [f.to_json() for f in sorted(seen.values(), key=sort_key)]
                print(json_text.dumps(r), flush=True)
                if final:
                    return EXIT[r["status"]]
            elif final and job is not None:
                return _print_job(eff, job, findings, r["status"], as_json)
            elif final:
                print(json_text.dumps(r, indent=2) if as_json else format_text(r), flush=True)
                return EXIT[r["status"]]
            elif not as_json:
                print(f"[{time.strftime('%H:%M:%S')}] " + format_text(r).splitlines()[0],
                      flush=True)
            await asyncio.sleep(1.0)


def _print_job(eff: EfficiencyView, job: str, findings: list[Finding], status: str,
               as_json: bool) -> int:
    if job not in eff.jobs:
        known = ", ".join(sorted(eff.jobs)[:10]) or "none"
        print(clean_lines(f"UNKNOWN: no job {job!r} reports steps (jobs: {known})"),
              flush=True)
        return EXIT["unknown"]
    document = {"status": status, **job_report(eff, job, findings)}
    print(json_text.dumps(document, indent=2) if as_json else
          clean_lines(f"{status.upper()}: " + job_text(document, 120, plain=True,
                                                       now=time.time())),
          flush=True)
    return EXIT[status]


async def first_samples(cluster: ClusterState, eff: EfficiencyView,
                        cpu_nodes: frozenset[str] = frozenset()) -> None:
    """Wait for what a verdict needs: two samples from every node that answers (or its
    failure), then step sums twice from every node that reports steps; both bounded."""
    start = time.monotonic()
    while time.monotonic() - start < FIRST_VERDICT_S and not all(
            (n.sample is not None and n.sample.seq >= 2) or n.old_data
            for n in cluster.nodes.values()):
        await asyncio.sleep(0.2)
    counted: dict[str, int] = {}
    steps_deadline = time.monotonic() + STEPS_WAIT_S
    while time.monotonic() < steps_deadline:
        for n in cluster.nodes.values():
            if n.pending_steps:
                counted[n.target] = counted.get(n.target, 0) + 1
        eff.update(cluster)  # takes the pending sums: counted above, credited here
        reporting = [n for n in cluster.nodes.values()
                     if n.status == UP and n.sample is not None and "steps" in n.sample.extra]
        # Nobody reporting yet may be a long first step: wait for it, within the bound,
        # where a step can come at all.
        if reporting and all(counted.get(n.target, 0) >= 2 for n in reporting):
            return
        if not reporting and not steps_may_come(cluster, cpu_nodes):
            return
        await asyncio.sleep(0.25)


def steps_may_come(cluster: ClusterState, cpu_nodes: frozenset[str] = frozenset()) -> bool:
    """Could a training job's first steps still come? Only from a node that is up and
    runs something on a GPU, or whose GPUs' processes are not known (Prometheus, a GPU
    or a MIG instance that cannot be read, a node whose GPUs NVML does not show):
    a snapshot of idle or unreachable nodes waits for none. With no node known yet
    (Prometheus or a relay not read yet), anything may come."""
    if not cluster.nodes or gpus_unseen(cluster, cpu_nodes):
        return True
    for n in cluster.nodes.values():
        if n.status != UP or n.sample is None:
            continue
        for g in n.sample.gpus or ():
            for part in (g, *(g.get("mig") or ())):
                procs = part.get("procs")
                if procs is None or procs > 0:
                    return True
    return False


async def relay_judgement(cluster: ClusterState) -> None:
    """Wait, within the first verdict's bound, for the relays' judgement of their nodes
    (sent with the first batch by a relay that judges; an older one never sends it, and
    the viewer then judges itself)."""
    start = time.monotonic()
    while cluster.relayed_findings() is None and \
            time.monotonic() - start < RELAY_JUDGEMENT_S:
        await asyncio.sleep(0.1)


async def settle(judge: Judgement) -> None:
    """Judge each second while a condition is held before it shows (at most HOLD_WAIT_S):
    a snapshot must not miss a finding only because it is young. Conditions the agents
    already held for long enough come raised (their `held`) and need no wait."""
    start = time.monotonic()
    judge.attribute_each_pass = False  # the next pass, settled, puts all of it down
    try:
        while True:
            judge.update()
            wait = judge.diagnosis.book.pending()
            left = HOLD_WAIT_S - (time.monotonic() - start)
            if wait <= 0 or left <= 0:
                return
            await asyncio.sleep(min(1.0, wait, left))
    finally:
        judge.attribute_each_pass = True


def _unreached(cluster: ClusterState, final: bool) -> list[Finding]:
    """At the end, nodes still connecting were never reached either: down, with why."""
    waiting = [n for n in cluster.nodes.values() if n.status == CONNECTING]
    if not final or not waiting:
        return []
    for n in waiting:
        n.reason = n.reason or "no answer within the snapshot"
    return [unreached(waiting, "not reached within the snapshot")]


async def print_history(relays: list[str], options: StreamOptions, since: float,
                        job: str | None, as_json: bool) -> str:
    """The incidents each relay's judgement held over the last `since` seconds, newest
    first; returns the status: ok, or unknown where a relay could not say."""
    from tuimon.sources.relay_history import HistoryError, read_history

    status = "ok"
    found: list[dict[str, Any]] = []
    problems = []
    for relay in relays:
        try:
            doc = await read_history(relay, options, since=since, job=job)
        except HistoryError as exc:
            problems.append(str(exc))
            status = "unknown"
            continue
        found += [{**i, "relay": relay} for i in doc["incidents"]]
    found.sort(key=lambda i: -i["onset"])
    if as_json:
        print(json_text.dumps({"status": status, "since": time.time() - since,
                               "incidents": found, "problems": problems}, indent=2))
        return status
    span = onset_text(time.time() - since, time.time()).split(" (")[0]
    head = (f"{plural(len(found), 'incident')} since {span}"
            + (f" that touched {job}" if job else "") + ("" if found else ": none"))
    print(clean_lines("\n".join([head, *incident_lines(found),
                                  *(f"UNKNOWN: {p}" for p in problems)])), flush=True)
    return status
