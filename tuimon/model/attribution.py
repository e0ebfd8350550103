"""What each kind of waiting is put down to: the findings that held while it was spent.

Every judgement (once a second), each job's waiting of that second, by kind, is shared
among the findings that held and explain it, in proportion to how strongly each explains
an efficiency loss (their `score`, as the efficiency-drop finding ranks its causes):

- `comm` (collectives): anything about the fabric or about a rank being slow (a leaf's
  congestion, a port's errors, a straggler, a throttling GPU, a downtrained link); in a
  synchronous job every rank waits in the collective for the slowest one;
- `data` and `checkpoint`: findings about a file system;
- `other`: any of them.

A finding counts for a job when it names the job, one of its nodes (or nodes of its, as a
leaf's finding lists them), or nothing narrower than the cluster (a file system). A
straggler's own node's findings are its cause, already in its message: the straggler
stands for them. Waiting while nothing explained it is `no finding`.

This is the viewer's count: the seconds it judged, as `JobState.causes`.
"""

from __future__ import annotations

from tuimon.model.efficiency import EfficiencyView, JobState
from tuimon_core.findings import Finding

NO_FINDING = "no finding"
MAX_CAUSES = 256  # per job: names from outside cannot grow it without end
FOLDED = "other findings"


def explains(kind: str, f: Finding) -> bool:
    """Whether finding `f` can explain waiting of this kind."""
    about_storage = f.fs is not None or f.kind.startswith("storage")
    if kind in ("data", "checkpoint"):
        return about_storage
    if kind == "comm":
        return not about_storage
    return True


def _concerns(f: Finding, job: str, nodes: set[str]) -> bool:
    if f.job is not None:
        return f.job == job
    if f.node is not None:
        return f.node in nodes
    if f.nodes:
        return not nodes.isdisjoint(f.nodes)
    return True  # the cluster's: a file system, the spine


def attribute(eff: EfficiencyView, findings: list[Finding]) -> None:
    """Share each job's waiting counted since the last judgement among the findings that
    explain it now."""
    candidates = [f for f in findings if f.score > 0]
    for state in eff.jobs.values():
        if state.unattributed:
            _share(state, candidates)
            state.unattributed = {}


def _share(state: JobState, candidates: list[Finding]) -> None:
    nodes = {node for node, _ in state.rank_where.values()}
    mine = [f for f in candidates if _concerns(f, state.job, nodes)]
    slow = {f.node for f in mine if f.kind == "straggler" and f.node is not None}
    mine = [f for f in mine if f.kind == "straggler" or f.node not in slow]
    for kind, seconds in state.unattributed.items():
        why = [f for f in mine if explains(kind, f)]
        total = sum(f.score for f in why)
        shares = ([(f"{f.kind} {f.where}", seconds * f.score / total) for f in why]
                  if why and total > 0 else [(NO_FINDING, seconds)])
        for cause, part in shares:
            key = (kind, cause)
            if key not in state.causes and len(state.causes) >= MAX_CAUSES:
                key = (kind, FOLDED)
            state.causes[key] = state.causes.get(key, 0.0) + part
