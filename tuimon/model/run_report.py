"""A run's report (`tuimon report`): the relay's document (`GET /v1/report`,
tuimon.relay.report) read into typed parts, for the Markdown and HTML renderers.

Pure: a document in, a `RunReport` out, nothing read from anywhere else. The budget is
read exactly as `tuimon status --job` reads it through a relay: the ledger's summary as a
`LedgerBurn` under the viewer's SLO (target and window), so both say the same hours for
the same moment; what it was spent on, and put down to, by the rows the job's screen
uses (`spent_rows`, `cause_rows`), and the burn-down by `burn_down`. A document that does
not read (a relay's bug, a hostile peer) is a `ReportError` naming the part, never a
traceback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tuimon.model.job_report import burn_down, cause_rows, spent_rows
from tuimon.model.slo import LedgerBurn, Slo
from tuimon_core.protocol.fields import MAX_HISTORY

# Causes of a kind the report lists: as many as the ledger keeps (its CAUSES_SENT) and
# their fold.
CAUSES_LISTED = 9


class ReportError(ValueError):
    """The relay's report does not read; the message names the part."""


@dataclass(frozen=True)
class SliPoint:
    at: float  # the period's start (Unix time)
    hours: float  # run hours counted in it
    sli: float | None  # effective / total run time; None where the job did not run


@dataclass(frozen=True)
class Spent:
    kind: str  # comm, data, checkpoint, stopped, other
    hours: float
    share: float  # of the spent hours
    what: str  # the kind in words


@dataclass(frozen=True)
class CauseRow:
    kind: str
    cause: str  # a finding as a cause: `congestion leaf03`, or `no finding`
    hours: float
    share: float  # of the kind's hours


@dataclass(frozen=True)
class Budget:
    hours: float  # the SLO's budget: (1 - target) x window
    consumed_hours: float
    left_hours: float
    window_h: float | None  # the window the relay's ledger counts over
    recovered_hours: float  # credited from the agents' totals for time the relay missed
    burn: str  # the burn rates as every view says them
    # What of the recovered time was lost, by the kinds the ranks' totals named.
    recovered_spent_hours: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Incident:
    id: int
    kind: str
    where: str
    severity: str
    onset: float
    ended: float | None  # None while it holds
    lost_h: float  # the budget the jobs it touched lost to it
    jobs: tuple[str, ...]
    flaps: int
    message: str
    nodes: str  # the nodes it named, as a host list ('' for one component)


@dataclass(frozen=True)
class NodeRow:
    node: str
    lost_h: float  # the job's lost hours put down to findings on this node, over the run
    share: float  # of the job's spent hours
    causes: tuple[str, ...]
    straggler_ratio: float | None  # its rank's compute time over its peers' median, now
    straggler_gpu: int | None
    straggler_rank: int | None
    straggler: str | None  # the straggler finding's message, now


@dataclass(frozen=True)
class LeafRow:
    leaf: str
    now: tuple[str, ...]  # the congestion found under it now
    incidents: tuple[int, ...]  # the incidents that named it
    lost_h: float  # what they cost (the incidents' own figure)


@dataclass(frozen=True)
class FleetRow:
    aspect: str  # `hca_fw:MT4126 InfiniBand`
    message: str
    nodes: str  # the nodes that differ
    job_nodes: str  # of them, the job's


@dataclass(frozen=True)
class RunReport:
    job: str
    relay: str
    generated_at: float
    start: float  # the range the SLI and the incidents cover
    until: float
    slo: Slo
    budget: Budget
    spent: list[Spent]
    causes: list[CauseRow]
    sli: list[SliPoint]
    sli_every_s: float
    sli_over: float | None  # over the whole range
    burn_down: dict[str, Any] | None  # tuimon.model.job_report.burn_down
    stopped: tuple[float, str] | None  # since when its ranks are all silent, and why
    incidents: list[Incident]
    nodes: list[NodeRow]
    leaves: list[LeafRow]
    fleet: list[FleetRow]
    job_nodes: str
    nodes_lost: tuple[str, ...]


# -- reading the document: every part checked, a named error otherwise -----------------

def _get(doc: Any, key: str, what: str) -> Any:
    if not isinstance(doc, dict) or key not in doc:
        raise ReportError(f"{what}: no {key!r}")
    return doc[key]


def _num(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value):
        raise ReportError(f"{what}: not a number: {str(value)[:40]!r}")
    return float(value)


def _maybe(value: Any, what: str) -> float | None:
    return None if value is None else _num(value, what)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ReportError(f"{what}: not text")
    return value


def _items(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ReportError(f"{what}: not a list")
    return value


def _series(doc: Any) -> tuple[list[SliPoint], float, float | None]:
    if doc is None:
        return [], 0.0, None
    start = _num(_get(doc, "from", "sli"), "sli.from")
    every = _num(_get(doc, "every_s", "sli"), "sli.every_s")
    totals = [_num(v, "sli.total_s") for v in _items(_get(doc, "total_s", "sli"), "sli")]
    effective = [_num(v, "sli.effective_s")
                 for v in _items(_get(doc, "effective_s", "sli"), "sli")]
    if every <= 0 or len(totals) != len(effective) or len(totals) > MAX_HISTORY + 1:
        raise ReportError("sli: periods that do not add up")
    points = [SliPoint(start + i * every, t / 3600,
                       min(1.0, max(0.0, e / t)) if t > 0 else None)
              for i, (t, e) in enumerate(zip(totals, effective, strict=True))]
    whole = sum(totals)
    return points, every, (min(1.0, max(0.0, sum(effective) / whole)) if whole > 0 else None)


def _incident(doc: Any) -> Incident:
    what = "incident"
    components = doc.get("components") if isinstance(doc, dict) else None
    nodes = components.get("nodes") if isinstance(components, dict) else None
    return Incident(int(_num(_get(doc, "id", what), "incident.id")),
                    _text(_get(doc, "kind", what), "incident.kind"),
                    _text(_get(doc, "where", what), "incident.where"),
                    _text(_get(doc, "severity", what), "incident.severity"),
                    _num(_get(doc, "onset", what), "incident.onset"),
                    _maybe(_get(doc, "ended", what), "incident.ended"),
                    _num(_get(doc, "lost_h", what), "incident.lost_h"),
                    tuple(_text(j, "incident.jobs") for j in
                          _items(_get(doc, "jobs", what), "incident.jobs")),
                    int(_num(_get(doc, "flaps", what), "incident.flaps")),
                    _text(_get(doc, "message", what), "incident.message"),
                    nodes if isinstance(nodes, str) else "")


def _node(doc: Any, spent: float) -> NodeRow:
    what = "nodes"
    lost = _num(_get(doc, "lost_h", what), "nodes.lost_h")
    slow = _get(doc, "straggler", what)
    if slow is not None and not isinstance(slow, dict):
        raise ReportError("nodes.straggler: not an object")
    slow = slow or {}
    gpu, rank = slow.get("gpu"), slow.get("rank")
    return NodeRow(_text(_get(doc, "node", what), "nodes.node"), lost,
                   lost / spent if spent > 0 else 0.0,
                   tuple(_text(c, "nodes.causes") for c in
                         _items(_get(doc, "causes", what), "nodes.causes")),
                   _maybe(slow.get("ratio"), "nodes.straggler.ratio"),
                   None if gpu is None else int(_num(gpu, "nodes.straggler.gpu")),
                   None if rank is None else int(_num(rank, "nodes.straggler.rank")),
                   _text(slow["message"], "nodes.straggler.message") if slow else None)


def _leaf(doc: Any) -> LeafRow:
    what = "leaves"
    return LeafRow(_text(_get(doc, "leaf", what), "leaves.leaf"),
                   tuple(_text(m, "leaves.now") for m in
                         _items(_get(doc, "now", what), "leaves.now")),
                   tuple(int(_num(i, "leaves.incidents")) for i in
                         _items(_get(doc, "incidents", what), "leaves.incidents")),
                   _num(_get(doc, "lost_h", what), "leaves.lost_h"))


def _fleet(doc: Any) -> FleetRow:
    what = "fleet"
    return FleetRow(*(_text(_get(doc, key, what), f"fleet.{key}")
                      for key in ("aspect", "message", "nodes", "job_nodes")))


def run_report(doc: dict[str, Any], slo: Slo) -> RunReport:
    """The relay's report document, read; the budget under `slo` (the viewer's, as
    `status --job` takes it)."""
    summary = _get(doc, "summary", "report")
    if not isinstance(summary, dict):
        raise ReportError("summary: not an object")
    now = _num(_get(doc, "generated_at", "report"), "generated_at")
    try:  # the summary's parts are read where they are used: a wrong one is named
        burn = LedgerBurn(slo, summary)
        text = burn.text(now)
        down = burn_down(burn, slo, now)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ReportError(f"summary: {exc}") from None
    consumed = _num(burn.consumed_hours, "summary.consumed_h")
    spent = {kind: _num(hours, f"summary.spent_h.{kind}")
             for kind, hours in burn.spent_hours.items()}
    causes = cause_rows({(kind, cause): _num(hours, f"summary.causes_h.{kind}")
                         for kind, by_cause in burn.causes_hours.items()
                         for cause, hours in (by_cause or {}).items()}, CAUSES_LISTED)
    points, every, over = _series(doc.get("sli"))
    stopped = None
    if burn.stopped_since is not None:
        stopped = (_num(burn.stopped_since, "summary.stopped_since"),
                   _text(burn.stopped_cause or "no finding", "summary.stopped_cause"))
    spent_total = sum(spent.values())
    rows = [Spent(**row) for row in spent_rows(spent)]
    order = [r.kind for r in rows if r.kind in causes]
    order += [kind for kind in causes if kind not in order]
    return RunReport(
        job=_text(_get(doc, "job", "report"), "job"),
        relay=_text(doc.get("relay") or "", "relay"),
        generated_at=now,
        start=_num(_get(doc, "from", "report"), "from"),
        until=_num(_get(doc, "until", "report"), "until"),
        slo=slo,
        budget=Budget(slo.budget_hours, consumed, slo.remaining_hours(consumed),
                      _maybe(burn.window_hours, "summary.window_h"),
                      _num(burn.recovered_hours, "summary.recovered_h"), text,
                      dict(burn.recovered_spent_hours)),
        spent=rows,
        # Kinds in the order the budget went to them, each kind's causes largest first.
        causes=[CauseRow(kind, c["cause"], c["hours"], c["share"]) for kind in order
                for c in causes[kind]],
        sli=points, sli_every_s=every, sli_over=over,
        burn_down=down,
        stopped=stopped,
        incidents=[_incident(i) for i in _items(doc.get("incidents"), "incidents")],
        nodes=[_node(n, spent_total) for n in _items(doc.get("nodes"), "nodes")],
        leaves=[_leaf(leaf) for leaf in _items(doc.get("leaves"), "leaves")],
        fleet=[_fleet(f) for f in _items(doc.get("fleet"), "fleet")],
        job_nodes=_text(doc.get("job_nodes") or "", "job_nodes"),
        nodes_lost=tuple(_text(n, "nodes_lost") for n in
                         _items(doc.get("nodes_lost"), "nodes_lost")))
