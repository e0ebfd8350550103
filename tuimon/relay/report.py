"""A run's report as the relay says it (`GET /v1/report?job=NAME`): one JSON document
from its ledger and its judgement, what a network review of the run starts from.

Every figure is read from its one owner, never computed again here: the budget from the
ledger's `summary` (what `tuimon status --job` reads through the relay's batches), the
SLI by period from the same minutes (`Ledger.sli_series`), the incidents and their cost
from the ledger's episodes (what `status --since` lists), and what holds now from the
relay's judgement. What this module adds is where the lost time lies: by node and by
leaf, joined on the incidents' components, not guessed from the causes' text.
"""

from __future__ import annotations

from typing import Any

from tuimon.relay.episodes import Episode
from tuimon.relay.fanout import FanOut
from tuimon.relay.ledger import Ledger
from tuimon_core.findings import Finding
from tuimon_core.hostlist import collect_hostlist

REPORT_VERSION = 1
MOST_NODES = 32  # rows of the slowest nodes
MOST_INCIDENTS = 1000
# A stop put down to one node (docs/definitions.md, "Stopped"): `node lost gpu042`.
NODE_LOST = "node lost "


def _node_of(cause: str, incidents: dict[str, Episode]) -> str | None:
    """The node a cause lies on: the node its incident was on (the finding's own
    component), or the node a stop was put down to alone; None for a leaf, a file
    system, the spine, several nodes, or a cause no incident of the run names."""
    episode = incidents.get(cause)
    if episode is not None:
        node = episode.components.get("node")
        return node if isinstance(node, str) else None
    if cause.startswith(NODE_LOST) and " " not in cause[len(NODE_LOST):]:
        return cause[len(NODE_LOST):]
    return None


def _nodes(summary: dict[str, Any], incidents: dict[str, Episode], findings: list[Finding],
           ratios: dict[tuple[str, int | None], tuple[int, float]]) -> list[dict[str, Any]]:
    """Per node: the job's lost hours over the run put down to causes on it (the
    ledger's causes, every kind), and its straggler now (the judgement's) with the
    ratio of its compute time to its peers' median."""
    rows: dict[str, dict[str, Any]] = {}

    def row(node: str) -> dict[str, Any]:
        return rows.setdefault(node, {"node": node, "lost_h": 0.0, "causes": {},
                                      "straggler": None})

    for by_cause in (summary.get("causes_h") or {}).values():
        for cause, hours in by_cause.items():
            node = _node_of(cause, incidents)
            if node is not None:
                r = row(node)
                r["lost_h"] += hours
                r["causes"][cause] = r["causes"].get(cause, 0.0) + hours
    for f in findings:
        if f.kind == "straggler" and f.node is not None:
            rank, ratio = ratios.get((f.node, f.gpu), (None, None))
            row(f.node)["straggler"] = {"gpu": f.gpu, "rank": rank, "ratio": ratio,
                                        "message": f.message}
    out = []
    for r in rows.values():
        causes = sorted(r["causes"].items(), key=lambda kv: -kv[1])
        out.append({**r, "causes": [c for c, _ in causes]})
    # The most budget first; among nodes that cost none yet, the slowest straggler.
    out.sort(key=lambda r: (-r["lost_h"], -((r["straggler"] or {}).get("ratio") or 0.0)))
    return out[:MOST_NODES]


def _leaves(incidents: list[Episode], findings: list[Finding]) -> list[dict[str, Any]]:
    """Per leaf (the spine too): the congestion found under it now, and the incidents
    that named it over the range, with what they cost (the episodes' own figure)."""
    rows: dict[str, dict[str, Any]] = {}

    def row(leaf: str) -> dict[str, Any]:
        return rows.setdefault(leaf, {"leaf": leaf, "now": [], "incidents": [], "lost_h": 0.0})

    for f in findings:
        if f.kind == "congestion" and f.leaf:
            row(f.leaf)["now"].append(f.message)
    for e in incidents:
        leaf = e.components.get("leaf")
        if isinstance(leaf, str) and leaf:
            r = row(leaf)
            r["incidents"].append(e.id)
            r["lost_h"] += e.lost_s / 3600
    return sorted(rows.values(), key=lambda r: (-r["lost_h"], r["leaf"]))


def _fleet(findings: list[Finding], job_nodes: set[str]) -> list[dict[str, Any]]:
    """The fleet's differences now (`fleet_skew`), each with the job's nodes among the
    ones that differ: a job is as fast as its slowest rank."""
    out = []
    for f in findings:
        if f.kind == "fleet_skew":
            mine = sorted(job_nodes.intersection(f.nodes))
            out.append({"message": f.message, "aspect": f.target or "",
                        "nodes": collect_hostlist(f.nodes) if f.nodes else "",
                        "job_nodes": collect_hostlist(mine) if mine else ""})
    return out


def report_document(ledger: Ledger, fanout: FanOut, relay: str, job: str, since: float,
                    now: float) -> dict[str, Any] | None:
    """The job's report over the `since` seconds before `now` (the budget: over the
    ledger's window, as every view has it); None when the ledger counts no such job."""
    summary = ledger.summary(now, job=job).get(job)
    if summary is None:
        return None
    # Said from the job's first counted minute where the range begins before it.
    start = max(now - since, summary["since"])
    # The incidents of the run window too: a cause is placed on its incident's node
    # over the same range its hours were counted over.
    run = ledger.incidents(min(start, now - ledger.window_hours * 3600), now, job=job,
                           most=MOST_INCIDENTS)
    shown = [e for e in run if e.ended is None or e.ended >= start]
    series = ledger.sli_series(job, now - since, now)  # the summary's bounds
    findings = fanout.findings
    nodes, lost = fanout.job_nodes(job)
    state = fanout.judge.judgement.efficiency.jobs.get(job)
    ratios = {(s.node, s.gpu): (s.rank, s.ratio) for s in (state.stragglers if state else ())}
    mine = fanout.job_findings(job)
    return {
        "version": REPORT_VERSION, "relay": relay, "job": job, "generated_at": now,
        "from": start, "until": now,
        "summary": summary,
        "sli": None if series is None else {
            "from": series.start, "every_s": series.every_s, "total_s": series.total_s,
            "effective_s": series.effective_s},
        "incidents": [e.to_json() for e in shown],
        "nodes": _nodes(summary, {e.key: e for e in run}, mine, ratios),
        "leaves": _leaves(shown, mine),
        "fleet": _fleet(findings, nodes),
        "job_nodes": collect_hostlist(sorted(nodes)) if nodes else "",
        "nodes_lost": sorted(lost),
    }
