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
    # How long the condition had already held where it was judged (a node's agent) when
    # this reader got it: its hold counts from then, not from the first frame read.
    held_s: float = 0.0

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
            from tuimon_core.hostlist import paste_hostlist

            # To paste: gpu[008-015], the names a shell would read otherwise left out.
            out["hosts"] = paste_hostlist(self.nodes)[0]
        return out


@dataclass(frozen=True, slots=True)
class Timing:
    raise_after: float  # seconds the condition must hold before the finding shows
    clear_after: float  # seconds the condition must be gone before the finding goes


DEFAULT_TIMING = Timing(0.0, 60.0)
# A condition's held_s is believed up to this: a node cannot backdate one further.
MAX_HELD_S = 86400.0
# Findings one node may have held at once (a node has 64 GPUs and a few hundred ports at
# most; its agent sends 256 conditions a sample at most).
MAX_PER_NODE = 1024


@dataclass(frozen=True, slots=True)
class Kind:
    """A finding kind, beside its name: its hold and hysteresis, and what the viewer
    makes of it."""

    timing: Timing = DEFAULT_TIMING
    many: str | None = None  # a line of many nodes with it: `17 {many}: gpu[001-017]`
    # It can make one rank slower than its peers when found on the rank's node at the
    # same time: a straggler's likely cause.
    slows_rank: bool = False
    # About the reader's own sources (a scrape, a relay, Prometheus), not the cluster.
    source: bool = False
    # Its coming and going is an event of its own (a node lost or back), or it is not
    # about the cluster (a bug in a part): no event for it raised or cleared.
    own_event: bool = False


# Every kind of finding, the one list: the rules that raise them (tuimon_core.node_rules,
# link_rules, fleet, write_surge; the model's diagnosis; the sources), the finding
# book's timings, the groups' words, a straggler's causes and the viewer's events read
# it. A kind not here (from a newer agent) is NO_KIND. Conditions over counters (symbol
# errors, link flaps, XIDs) already look back over their own window; the timings add the
# hold and the hysteresis.
KINDS: dict[str, Kind] = {
    # The viewer's sources and the nodes it reads.
    "node_lost": Kind(Timing(0.0, 0.0), "nodes lost", own_event=True),  # as its state
    "unreached": Kind(many="nodes never reached", own_event=True),
    "relay_lost": Kind(Timing(0.0, 0.0), source=True, own_event=True),  # as it stands
    "source_lost": Kind(Timing(0.0, 0.0), source=True, own_event=True),  # Prometheus
    "scrape_failed": Kind(Timing(0.0, 30.0), "failed scrapes", source=True),
    "relay_refused": Kind(source=True),
    "source_limit": Kind(source=True),
    "duplicate_name": Kind(),
    "no_topology": Kind(),
    "internal_error": Kind(own_event=True),
    # GPUs. Held a few samples before they show (a burst is not a fault), short enough
    # that a one-shot `tuimon status` sees a fault that is already there.
    "gpu_init_failed": Kind(many="nodes without their GPUs"),
    "gpu_failed": Kind(many="GPUs failed"),
    "gpu_missing": Kind(Timing(0.0, 60.0)),
    "thermal": Kind(Timing(3.0, 60.0), "thermal throttling", slows_rank=True),
    "power": Kind(Timing(5.0, 60.0), "power-capped", slows_rank=True),
    "hw_slowdown": Kind(slows_rank=True),
    "xid": Kind(many="XIDs", slows_rank=True),
    "ecc": Kind(Timing(0.0, 300.0), slows_rank=True),
    "remap": Kind(Timing(0.0, 300.0)),
    "remap_pending": Kind(Timing(0.0, 300.0), slows_rank=True),
    # The links inside a node. A link below its speed while the GPU is busy, held: a GPU
    # that just woke up is still raising its link.
    "pcie_downtrained": Kind(Timing(10.0, 120.0), slows_rank=True),
    "pcie_slot_limited": Kind(slows_rank=True),
    "pcie_replays": Kind(Timing(0.0, 300.0), slows_rank=True),
    "nvlink_errors": Kind(Timing(0.0, 600.0), slows_rank=True),
    "nvlink_down": Kind(Timing(0.0, 120.0), slows_rank=True),
    "gpudirect_off": Kind(),
    # The fabric.
    "link_down": Kind(Timing(3.0, 60.0), "links down", slows_rank=True),
    "flapping": Kind(many="links flapping", slows_rank=True),
    "symbol_errors": Kind(many="ports with symbol errors", slows_rank=True),
    "port_errors": Kind(slows_rank=True),
    "counter_saturated": Kind(),
    "congestion": Kind(Timing(5.0, 60.0), "congested", slows_rank=True),
    "pfc_pausing": Kind(Timing(10.0, 120.0), slows_rank=True),
    "pfc_storm": Kind(Timing(0.0, 600.0), slows_rank=True),
    # Judged over its own window (node_rules.DROP_WINDOW_S): raised as it holds there.
    "port_drops": Kind(Timing(0.0, 120.0), "ports dropping packets", slows_rank=True),
    "port_disabled": Kind(Timing(3.0, 60.0), "ports disabled", slows_rank=True),
    # Storage. A surge is held over its own window (tuimon_core.write_surge); cleared with
    # the next normal minute's grace, so a storm that pauses between saves stays one.
    "storage": Kind(Timing(5.0, 60.0)),
    "storage_latency": Kind(Timing(5.0, 120.0), "slow NFS reads", slows_rank=True),
    "storage_surge": Kind(Timing(0.0, 120.0)),
    # The fleet, the jobs, their step reports.
    "fleet_skew": Kind(slows_rank=True),
    "straggler": Kind(many="stragglers"),
    "efficiency_drop": Kind(Timing(0.0, 120.0)),
    "burn_page": Kind(Timing(0.0, 300.0)),
    "burn_ticket": Kind(Timing(0.0, 300.0)),
    "steps_refused": Kind(Timing(0.0, 600.0)),
    "steps_lost": Kind(Timing(0.0, 600.0)),
}
NO_KIND = Kind()
# By kind: what the finding book holds each for (DEFAULT_TIMING where not said).
TIMINGS: dict[str, Timing] = {name: k.timing for name, k in KINDS.items()}
# The longest hold of any kind: how long a one-shot check may wait for a finding that is
# being held to be raised.
LONGEST_HOLD_S = max(t.raise_after for t in TIMINGS.values())


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
    _updated: float | None = None
    # node -> entries it has: a node whose findings name a new port every second would
    # otherwise hold each a minute (its hysteresis) and grow the book without end.
    _per_node: dict[str | None, int] = field(default_factory=dict)
    refused: int = 0  # conditions not taken: their node held MAX_PER_NODE already

    def update(self, conditions: Iterable[Finding], now: float) -> list[Finding]:
        self._updated = now
        seen = set()
        per_node = self._per_node
        for c in conditions:
            key = c.key
            entry = self._entries.get(key)
            since = now - min(c.held_s, MAX_HELD_S) if c.held_s > 0 else now
            if entry is None:
                if c.node is not None and per_node.get(c.node, 0) >= MAX_PER_NODE:
                    self.refused += 1
                    continue
                per_node[c.node] = per_node.get(c.node, 0) + 1
                entry = self._entries[key] = _Entry(since, now, c)
            elif since < entry.since:
                entry.since = since
            seen.add(key)
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
                    node = entry.latest.node
                    per_node[node] -= 1
                    if not per_node[node]:
                        del per_node[node]
                    continue
            elif entry.raised_at is None:
                if now - entry.since < timing.raise_after:
                    continue
                entry.raised_at = now
            out.append(replace(entry.latest, first_seen=entry.since, last_seen=entry.last))
        out.sort(key=sort_key)
        return out

    def pending(self) -> float:
        """Seconds from the last update until the last condition held then but not yet
        raised would be raised, if it lasts (0: none waits). A one-shot check waits this
        long, so it shows what a viewer that watched would."""
        wait = 0.0
        for entry in self._entries.values():
            if entry.raised_at is None and entry.last == self._updated:
                timing = self.timings.get(entry.latest.kind, DEFAULT_TIMING)
                wait = max(wait, timing.raise_after - (entry.last - entry.since))
        return wait

    def held(self, conditions: Iterable[Finding], now: float) -> list[Finding]:
        """These conditions (given to `update` at `now`) with how long each has held, for
        a reader that judges them again: an agent sends them so (docs/protocol.md)."""
        out = []
        for c in conditions:
            entry = self._entries.get(c.key)
            held = round(now - entry.since, 1) if entry is not None else 0.0
            out.append(replace(c, held_s=held) if held > 0 else c)
        return out


def sort_key(f: Finding) -> tuple[object, ...]:
    return (SEVERITY_ORDER.get(f.severity, 3), -f.score, f.where)
