"""One job, whole: what its screen (`b`) and `tuimon status --job NAME` show.

Built once from the efficiency view and the judgement's findings, as a plain document
(JSON as it is): the views only format it. The job's numbers are the same ones the strip
and `status` show (the SLI windows, the efficiency against a baseline or its own best,
the budget and burn), with what only a job's own view has room for: what the budget was
spent on, largest first, with each kind's share; what the step time waited on over the
last hour; how the ranks' compute time spreads, the stragglers named; its nodes; and the
findings that name the job or one of its nodes.
"""

from __future__ import annotations

import statistics
from typing import Any

from tuimon.model.attribution import concerning
from tuimon.model.efficiency import WINDOWS, EfficiencyView, JobState
from tuimon.model.slo import LedgerBurn, Slo, budget_scope
from tuimon_core.findings import Finding
from tuimon_core.hostlist import collect_hostlist
from tuimon_core.wait_kinds import WAIT_WORDS

SPREAD_BINS = 10  # the ranks' compute time, in this many bins from the fastest to the slowest


def rank_spread(state: JobState) -> dict[str, Any] | None:
    """The ranks' mean compute time per step over the straggler window, as the straggler
    rule reads it: median, slowest, and a histogram from the fastest to the slowest."""
    means = {rank: sum(v for _, v in q) / len(q)
             for rank, q in state.rank_compute.items() if q}
    if not means:
        return None
    values = sorted(means.values())
    low, high = values[0], values[-1]
    bins = [0] * SPREAD_BINS
    for v in values:
        at = 0 if high <= low else min(SPREAD_BINS - 1,
                                       int((v - low) / (high - low) * SPREAD_BINS))
        bins[at] += 1
    slowest = max(means, key=means.__getitem__)
    node, gpu = state.rank_where.get(slowest, ("?", None))
    return {"ranks": len(values), "median_s": statistics.median(values), "fastest_s": low,
            "slowest_s": high, "slowest": {"rank": slowest, "node": node, "gpu": gpu},
            "bins": bins}


def spent_rows(spent: dict[str, float]) -> list[dict[str, Any]]:
    """What the budget was spent on, by kind, largest first (the review's question is
    what the most went to), each with its share of the spent hours and its words."""
    total = sum(spent.values())
    return [{"kind": kind, "hours": hours, "share": hours / total if total else 0.0,
             "what": WAIT_WORDS.get(kind, kind)}
            for kind, hours in sorted(spent.items(), key=lambda kv: -kv[1])]


def cause_rows(hours: dict[tuple[str, str], float], most: int = 4
               ) -> dict[str, list[dict[str, Any]]]:
    """kind -> its causes, largest first, each with its share of the kind."""
    out: dict[str, list[dict[str, Any]]] = {}
    for (kind, cause), value in hours.items():
        out.setdefault(kind, []).append({"cause": cause, "hours": value})
    for rows in out.values():
        total = sum(r["hours"] for r in rows) or 1.0
        rows.sort(key=lambda r: -r["hours"])
        for r in rows:
            r["share"] = r["hours"] / total
        # Largest first, at most `most`, none that rounds to nothing.
        rows[:] = [r for r in rows[:most] if r["share"] >= 0.005]
    return out


LAST_TIME = 95e9  # the wire's bound on a time: a window past it is cut there


def burn_down(burn: LedgerBurn, slo: Slo, now: float) -> dict[str, Any] | None:
    """The budget left at the end of each period of the ledger's history (the last one
    now), and where an even burn from the job's start to the end of its window would
    have it then."""
    if burn.lost_from is None or not burn.lost_hours:
        return None
    step = burn.lost_every_h * 3600
    start = burn.since if burn.since is not None else burn.lost_from
    end_of_window = min(LAST_TIME, start + (burn.window_hours or slo.window_hours) * 3600)

    def even(t: float) -> float:
        share = (t - start) / max(1.0, end_of_window - start)
        return slo.budget_hours * min(1.0, max(0.0, 1 - share))

    left, evens, spent = [], [], 0.0
    for i, lost in enumerate(burn.lost_hours):
        spent += lost
        end = min(now, burn.lost_from + (i + 1) * step)
        left.append(slo.remaining_hours(spent))
        evens.append(even(end))
    return {"from": burn.lost_from, "every_h": burn.lost_every_h, "left_hours": left,
            "even_hours": evens, "budget_hours": slo.budget_hours, "since": start,
            "window_end": end_of_window}


def job_report(eff: EfficiencyView, name: str, findings: list[Finding]) -> dict[str, Any]:
    """The job's document; KeyError when no job of that name reports steps."""
    state = eff.jobs[name]
    now = eff.now
    slis = state.sli_windows(now)
    throughput = state.throughput(WINDOWS["1m"], now)
    versus = eff.efficiency(state, throughput)
    burn = state.burn
    used = burn.consumed_hours if burn else 0.0
    spent = dict(burn.spent_hours) if burn else {}
    waited, waits = state.wait_shares(WINDOWS["1h"], now)
    verdict = state.verdict(now)
    ledger = burn if isinstance(burn, LedgerBurn) else None
    nodes = sorted(state.nodes())
    mine = set(nodes)
    return {
        "job": name,
        "world": state.world,
        "ranks_reporting": verdict.reporting,
        "verdict": verdict.state,
        "sli": {w: v[0] for w, v in slis.items()},
        # Seconds of each window its SLI covers (short where neither the nodes nor this
        # viewer watched all of it).
        "sli_covered_s": {w: round(v[1], 1) for w, v in slis.items()},
        "sli_series": eff.sli_series(state, 60),
        "samples_per_s": throughput,
        "efficiency": None if versus is None else {"value": versus[0], "against": versus[1]},
        "budget": {
            "hours": eff.slo.budget_hours,
            "left_hours": eff.slo.remaining_hours(used),
            "consumed_hours": used,
            "scope": budget_scope(burn),
            "burn": burn.text(now) if burn else "-",
            # Run hours the relay missed and counted from the agents' totals, and what of
            # them was lost by the kinds the ranks reported (a relay's ledger only).
            "recovered_hours": ledger.recovered_hours if ledger else 0.0,
            "recovered_spent_hours": dict(ledger.recovered_spent_hours) if ledger else {},
        },
        "spent": spent_rows(spent),
        "waiting_1h": {"share": waited, "kinds": waits},
        # What this viewer put each kind's waiting down to while it watched, largest
        # first (tuimon.model.attribution): kind -> [{cause, hours, share of the kind}].
        "causes": cause_rows({k: v / 3600 for k, v in state.causes.items()}),
        # The same over the run, as the relay's ledger put it down (its findings).
        "run_causes": cause_rows({(kind, cause): hours for kind, by_cause in
                               (ledger.causes_hours if ledger else {}).items()
                               for cause, hours in by_cause.items()}),
        "burn_down": burn_down(ledger, eff.slo, now) if ledger else None,
        "stopped": None if verdict.state != "stopped" else {
            "for_s": verdict.steps_age, "cause": verdict.cause},
        "ranks": rank_spread(state),
        "stragglers": [{"rank": s.rank, "node": s.node, "gpu": s.gpu, "ratio": s.ratio}
                       for s in state.stragglers],
        "nodes": nodes,
        "nodes_text": collect_hostlist(nodes) if nodes else "",
        # The findings that concern the job, as its waiting is put down to them: its
        # own, its nodes' (not another job's on a shared node), the cluster's.
        # `since`: when each began (Unix time), where known.
        "findings": [{"severity": f.severity, "kind": f.kind, "where": f.where,
                      "message": f.message, "since": f.first_seen}
                     for f in concerning(findings, name, mine)],
    }
