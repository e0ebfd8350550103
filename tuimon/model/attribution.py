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

from collections.abc import Mapping

from tuimon.model.efficiency import EfficiencyView, JobState
from tuimon_core.findings import Finding, sort_key
from tuimon_core.hostlist import collect_hostlist
from tuimon_core.write_surge import KIND as SURGE

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
    nodes = state.nodes()
    mine = [f for f in candidates if _concerns(f, state.job, nodes)]
    add_causes(state.causes, share(state.unattributed, mine))


def share(seconds: dict[str, float], findings: list[Finding]) -> dict[tuple[str, str], float]:
    """Seconds waited by kind, shared among `findings` (those that concern the job) by
    their score: (kind, cause) -> seconds; a kind nothing explains goes to `no finding`.
    The viewer's count and the relay ledger's run-long one both share by this."""
    mine = _signals(findings)
    out: dict[tuple[str, str], float] = {}
    for kind, waited in seconds.items():
        if waited <= 0:
            continue
        # One weight a cause (the same finding on eight nodes is one cause, not eight),
        # as the efficiency drop's `likely` weighs them.
        weights: dict[str, float] = {}
        for f in mine:
            if explains(kind, f):
                name = cause_name(f)
                weights[name] = max(weights.get(name, 0.0), f.score)
        total = sum(weights.values())
        parts = ([(name, waited * w / total) for name, w in weights.items()]
                 if total > 0 else [(NO_FINDING, waited)])
        for cause, part in parts:
            out[(kind, cause)] = out.get((kind, cause), 0.0) + part
    return out


def _signals(findings: list[Finding]) -> list[Finding]:
    """The findings that can explain lost time (a score), less a straggler's own node's
    others: the straggler stands for them (its message names them)."""
    mine = [f for f in findings if f.score > 0]
    slow = {f.node for f in mine if f.kind == "straggler" and f.node is not None}
    return [f for f in mine if f.kind == "straggler" or f.node not in slow]


def add_causes(into: dict[tuple[str, str], float],
               causes: dict[tuple[str, str], float]) -> None:
    """Sum shares into a bounded table: past MAX_CAUSES names, the rest of a kind is
    `other findings`."""
    for key, part in causes.items():
        if key not in into and len(into) >= MAX_CAUSES:
            key = (key[0], FOLDED)
        into[key] = into.get(key, 0.0) + part


def cause_name(f: Finding) -> str:
    """A finding as a cause: its kind and where (`congestion leaf03`); a shared file
    system written far above its level is one cause however many nodes write it."""
    if f.kind == SURGE and f.fs is not None:
        return f"{f.kind} {f.fs}"
    return f"{f.kind} {f.where}"


def likely(shares: Mapping[str, float], findings: list[Finding], job: str,
           nodes: set[str], most: int = 3) -> list[str]:
    """The likely causes of a job's lost time, most likely first, as cause names: each
    finding that concerns the job weighted by its score times the share of the job's
    waiting (`shares`, kind -> share of the step time) of the kinds it explains, so a
    job that waits on `checkpoint` is put down to a file system, one that waits in its
    collectives to the fabric; with no waiting known, by score alone. The same finding
    on several nodes about one file system is one cause, its nodes as a host list."""
    weights: dict[str, float] = {}
    members: dict[str, set[str]] = {}
    signals = _signals(findings)
    # Where its ranks run is not known (no rank placed yet): any of them may be it.
    for f in concerning(signals, job, nodes) if nodes else signals:
        weight = f.score * (sum(v for k, v in shares.items() if explains(k, f))
                            if shares else 1.0)
        if weight <= 0:
            continue
        name = cause_name(f)
        weights[name] = max(weights.get(name, 0.0), weight)
        if f.node is not None:
            members.setdefault(name, set()).add(f.node)
    order = sorted(weights, key=lambda n: -weights[n])[:most]
    return [f"{n} ({collect_hostlist(members[n])})" if len(members.get(n, ())) > 1 else n
            for n in order]


def concerning(findings: list[Finding], job: str, nodes: set[str]) -> list[Finding]:
    """The findings that concern a job running on `nodes`."""
    return [f for f in findings if _concerns(f, job, nodes)]


def stop_cause(lost: list[str], findings: list[Finding]) -> str:
    """What a job's ranks falling silent is put down to: a node of the job lost (its
    agent gone), else the gravest finding on its nodes when it stopped, else nothing."""
    if lost:
        more = f" and {len(lost) - 1} more" if len(lost) > 1 else ""
        return f"node lost {sorted(lost)[0]}{more}"
    if findings:
        return cause_name(min(findings, key=sort_key))
    return NO_FINDING
