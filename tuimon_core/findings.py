"""Findings: judgements over a window, with hysteresis, naming their component.

A rule says what holds now (a condition: thermal throttling on gpu012 GPU 3, symbol
errors on a port within the last 10 minutes). `FindingBook` turns conditions into
findings: one is raised once its condition has held for the kind's `raise_after`, and
stays until the condition has been absent for its `clear_after`, so a snapshot taken at
any second tells the same story and a fault that rides on one sample in five does not
flicker. Each finding carries its component in fields (node, GPU, port, leaf, file
system, job); `where` and the message are made from them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tuimon_core.protocol.fields import SEVERITIES

# Worst first: the order findings are shown in, from the wire's severities (least first).
SEVERITY_ORDER = {severity: i for i, severity in enumerate(reversed(SEVERITIES))}


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str  # critical | warning | info
    kind: str  # thermal, xid, link_down, symbol_errors, congestion, straggler, ...
    message: str
    node: str | None = None
    gpu: int | None = None
    port: str | None = None
    leaf: str | None = None
    fs: str | None = None
    job: str | None = None
    # What reported the problem, when that is the component (a Prometheus scrape target).
    target: str | None = None
    score: float = 0.0  # how strongly it explains an efficiency drop
    # Nodes a finding about several names them all (a leaf's nodes, lost nodes).
    nodes: tuple[str, ...] = ()
    first_seen: float | None = None  # when the condition started (raised: when raised)
    last_seen: float | None = None  # the last time the condition held

    @property
    def where(self) -> str:
        """The component in words: `gpu012 GPU 3`, `gpu012 mlx5_2:1`, `gpu012 /home`,
        `leaf03`, a mount point, a job."""
        if self.node is not None:
            if self.gpu is not None:
                return f"{self.node} GPU {self.gpu}"
            if self.port is not None:
                return f"{self.node} {self.port}"
            if self.fs is not None:
                return f"{self.node} {self.fs}"
            return self.node
        if self.leaf or self.fs or self.job:
            return self.leaf or self.fs or self.job or ""
        if self.nodes:
            from tuimon_core.hostlist import collect_hostlist

            return collect_hostlist(self.nodes)
        return self.kind

    @property
    def key(self) -> tuple[object, ...]:
        return (self.kind, self.node, self.gpu, self.port, self.leaf, self.fs, self.job,
                self.target)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"severity": self.severity, "kind": self.kind,
                                  "where": self.where, "message": self.message}
        for name in ("node", "gpu", "port", "leaf", "fs", "job", "target", "first_seen",
                     "last_seen"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.nodes:
            out["nodes"] = list(self.nodes)
        return out


@dataclass(frozen=True, slots=True)
class Timing:
    raise_after: float  # seconds the condition must hold before the finding shows
    clear_after: float  # seconds the condition must be gone before the finding goes


DEFAULT_TIMING = Timing(0.0, 60.0)
# By kind. Conditions over counters (symbol errors, link flaps, XIDs) already look back
# over their own window; these add the hold and the hysteresis.
TIMINGS: dict[str, Timing] = {
    "node_lost": Timing(0.0, 0.0),  # the node's up/stale/down state has its own timing
    "scrape_failed": Timing(0.0, 30.0),
    # Held a few samples before they show (a burst is not a fault), short enough that a
    # one-shot `tuimon status` sees a fault that is already there.
    "thermal": Timing(3.0, 60.0),
    "power": Timing(5.0, 60.0),
    "link_down": Timing(3.0, 60.0),
    "congestion": Timing(5.0, 60.0),
    "storage": Timing(5.0, 60.0),
    "storage_latency": Timing(5.0, 120.0),
    "ecc": Timing(0.0, 300.0),
    "remap": Timing(0.0, 300.0),
    "remap_pending": Timing(0.0, 300.0),
    "efficiency_drop": Timing(0.0, 120.0),
    "burn_page": Timing(0.0, 300.0),
    "burn_ticket": Timing(0.0, 300.0),
    "steps_refused": Timing(0.0, 600.0),
    "steps_lost": Timing(0.0, 600.0),
}


@dataclass(slots=True)
class _Entry:
    since: float
    last: float
    latest: Finding
    raised_at: float | None = None


@dataclass
class FindingBook:
    """Conditions in, findings out, with each kind's hold and hysteresis."""

    timings: dict[str, Timing] = field(default_factory=lambda: dict(TIMINGS))
    _entries: dict[tuple[object, ...], _Entry] = field(default_factory=dict)

    def update(self, conditions: Iterable[Finding], now: float) -> list[Finding]:
        seen = set()
        for c in conditions:
            key = c.key
            seen.add(key)
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(now, now, c)
            entry.last = now
            entry.latest = c
        out = []
        for key, entry in list(self._entries.items()):
            timing = self.timings.get(entry.latest.kind, DEFAULT_TIMING)
            if key not in seen:
                # The condition is gone: a raised finding stays for clear_after, one not
                # yet raised starts over.
                if entry.raised_at is None or now - entry.last >= timing.clear_after:
                    del self._entries[key]
                    continue
            elif entry.raised_at is None:
                if now - entry.since < timing.raise_after:
                    continue
                entry.raised_at = now
            out.append(replace(entry.latest, first_seen=entry.since, last_seen=entry.last))
        out.sort(key=sort_key)
        return out


def sort_key(f: Finding) -> tuple[object, ...]:
    return (SEVERITY_ORDER.get(f.severity, 3), -f.score, f.where)
