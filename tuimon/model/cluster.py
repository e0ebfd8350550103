"""The cluster as the viewer knows it: one `NodeState` per target, and recent events.

Sources call it through their sink protocols (`StreamSink` in
tuimon/sources/agent_stream.py, `PromSink` in tuimon/sources/prometheus.py, the replay's
`SINK_CALLS` in tuimon/sources/recording.py); views read it, and tell it only what they
want (`ViewWants` in tuimon/model/view_state.py). Every change bumps the node's `version`
so a view redraws only what changed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from tuimon.model.node_state import ClusterEvent, NodeState
from tuimon.model.step_credit import merge_steps
from tuimon_core.findings_family import findings_from_judgement
from tuimon_core.identity import NameHolders, may_carry
from tuimon_core.node_states import LOST, STALE, STATES, UNKNOWN, UP
from tuimon_core.overview import build_overview, hello_port_ids
from tuimon_core.ports import DEFAULT_PORT
from tuimon_core.protocol import Event, Hello, Sample
from tuimon_core.protocol.overview_layout import busy
from tuimon_core.protocol.text import clean
from tuimon_core.timing import aged_state, lost_state
from tuimon_core.wording import clock_text, plural

MAX_EVENTS = 2000
MAX_RELAY_PROBLEMS = 16


def _name_of(target: str) -> str:
    """What to call a node before its hello says: the host, or host:port when the port
    is not the agent's (several agents on one address, as the simulator runs them)."""
    host, sep, port = target.rpartition(":")
    return host if sep and port == str(DEFAULT_PORT) else target


def relay_lost_text(relay: str, reason: str, nodes: int) -> str:
    """What the event and the finding both say of a relay that stopped answering."""
    return f"relay {relay} unreachable: {reason}; its {plural(nodes, 'node')} unknown"


def no_data_note(since: float, why: str) -> str:
    """What a finding kept from before its data stopped adds: it is unknown now, not
    cleared (a GPU throttling then may throttle still)."""
    return f" (no data since {clock_text(since)}: {why})"


class ClusterState:
    """All nodes and events; the one object views draw from."""

    def __init__(self, name: str = "cluster", clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.name = name
        self.clock = clock
        # Unix time of what the viewer itself notes (a node lost, a source gone): a
        # replay's own, so that its events and onsets read as they did live.
        self.wall = wall
        self.nodes: dict[str, NodeState] = {}
        self.events: deque[ClusterEvent] = deque(maxlen=MAX_EVENTS)
        self.version = 0
        # Bumped when a node comes, goes or says hello (its name and GPU count): what
        # a map's layout depends on, apart from its own sort and filter.
        self.layout_version = 0
        # Bumped with every hello and node come or gone: what gpu_total and interval read.
        self._hellos_version = 0
        self._hellos_read: tuple[int, tuple[int, float | None]] = (-1, (0, None))
        self.protocol_errors = 0
        # job -> the relay ledger's budget summary (batch.budget), when watching a relay.
        self.budgets: dict[str, dict[str, Any]] = {}
        self._budgets_by_source: dict[str, dict[str, dict[str, Any]]] = {}
        # Which target holds each node name; those refused for saying a held one.
        self.names = NameHolders()
        # relay -> its latest judgement's findings (apply_judgement).
        self.relay_judgements: dict[str, list[Any]] = {}
        # source -> what it left out at a bound (note_source_limit).
        self.source_limits: dict[str, str] = {}
        # Prometheus targets whose last scrape failed: "job instance" -> (node, reason).
        self.scrape_failures: dict[str, tuple[str, str]] = {}
        # relay -> problem -> text: what a relay did that the viewer refused (declared too
        # many nodes, claimed another relay's): shown as findings naming both.
        self.relay_problems: dict[str, dict[str, str]] = {}
        # What the sources told the model besides frames (a node lost, a relay's states
        # and budget), for a recording: `recorder(method, *args)` (tuimon.sources.recording).
        self.recorder: Callable[..., None] | None = None
        # relay -> (why it is unreachable, since (Unix time), the nodes it carried).
        self.lost_relays: dict[str, tuple[str, float, tuple[str, ...]]] = {}
        # The server every node is read through (Prometheus) -> (why it does not answer,
        # since (Unix time), how many nodes it carried).
        self.lost_sources: dict[str, tuple[str, float, int]] = {}
        self._more_problems: dict[str, set[str]] = {}
        # Targets the viewer looks at closely (the node screen): sources are told, and take
        # those nodes' full samples instead of their overviews.
        self.detail_targets: frozenset[str] = frozenset()
        self._detail_listeners: list[Callable[[frozenset[str]], None]] = []
        # The sample fields the maps draw from every node (the HeatMetric.reads of the
        # metric on screen), or None for every field (no map: a readout, a recording).
        # A source that pays for each field it asks (tuimon prom) asks the others only of
        # the nodes whose screen is open.
        self.drawn: frozenset[str] | None = None
        # The fields such a source did not ask at its last read (set_unasked).
        self.unasked: frozenset[str] = frozenset()
        # Told when the detail targets or the drawn fields change (a source that polls
        # asks again at once, not at its next refresh).
        self._wants_listeners: list[Callable[[], None]] = []
        # Told when a source has applied a whole read of the cluster at once (tuimon
        # prom's refresh): a view draws it then, not at its next timer.
        self._read_listeners: list[Callable[[], None]] = []

    def add_target(self, target: str) -> NodeState:
        node = self.nodes.get(target)
        if node is None:
            node = self.nodes[target] = NodeState(target, clean(_name_of(target)))
            self.version += 1
            self.layout_version += 1
            self._hellos_version += 1
        return node

    def claim(self, source: str, relay: str) -> bool:
        """May `relay` speak for `source`? Yes for a node new to the view or already its
        own; no for a node watched directly or carried by another relay."""
        return may_carry(self.nodes.get(source), relay, lambda: self.add_target(source))

    def owner_of(self, source: str) -> str | None:
        """The relay that carries `source` (None: watched directly, or unknown)."""
        node = self.nodes.get(source)
        return node.owner if node is not None else None

    def note_relay_problem(self, relay: str, key: str, text: str | None) -> None:
        """A relay's problem as the viewer sees it (None clears it); at most
        MAX_RELAY_PROBLEMS kept a relay, the rest counted, each once."""
        if text is None:
            problems = self.relay_problems.get(relay)
            if problems and problems.pop(key, None) is not None:
                self._record("note_relay_problem", relay, key, text)
                self.version += 1
            return
        problems = self.relay_problems.setdefault(relay, {})
        if problems.get(key) == text:
            return  # every batch says it again: nothing new
        self._record("note_relay_problem", relay, key, text)
        if key in problems or len(problems) < MAX_RELAY_PROBLEMS:
            problems[key] = text
        else:
            more = self._more_problems.setdefault(relay, set())
            if key in more or len(more) >= MAX_RELAY_PROBLEMS * 64:
                return
            more.add(key)
            problems["more"] = f"{len(more)} more problems with relay {relay}"
        self.version += 1

    def note_source_limit(self, source: str, text: str | None) -> None:
        """A source that left part of what it read out at a bound (tuimon prom naming
        more nodes than it shows): said as a finding while it lasts (None: no more)."""
        if self.source_limits.get(source) == text:
            return
        self._record("note_source_limit", source, text)
        if text is None:
            self.source_limits.pop(source, None)
        elif source in self.source_limits or len(self.source_limits) < MAX_RELAY_PROBLEMS:
            self.source_limits[source] = text
        self.version += 1

    def _record(self, method: str, *args: Any) -> None:
        if self.recorder is not None:
            self.recorder(method, *args)

    def relay_lost(self, relay: str, sources: set[str] | frozenset[str], reason: str) -> None:
        """The relay that carries `sources` is unreachable: one fault, said in one event;
        its nodes are unknown (not lost: nothing says they are) until it is back."""
        self._record("relay_lost", relay, sorted(sources), reason)
        names = []
        for source in sources:
            node = self.nodes.get(source)
            if node is None:
                continue
            names.append(node.name)
            if node.status != UNKNOWN:
                node.status = UNKNOWN
                node.reason = f"relay {relay} unreachable"
                node.version += 1
        known = self.lost_relays.get(relay)
        since = known[1] if known is not None else self.wall()
        self.lost_relays[relay] = (reason, since, tuple(sorted(names)))
        self.version += 1
        if known is None:
            self.events.appendleft(ClusterEvent(
                relay, since, "relay_lost", "critical",
                relay_lost_text(relay, reason, len(names))))

    def relay_back(self, relay: str) -> None:
        """The relay answers again: its nodes come back as their frames and states do."""
        self._record("relay_back", relay)
        if self.lost_relays.pop(relay, None) is not None:
            self.version += 1
            self.events.appendleft(ClusterEvent(relay, self.wall(), "relay_back", "info",
                                                f"relay {relay} back"))

    def source_lost(self, source: str, reason: str) -> None:
        """The server every node is read through (Prometheus) does not answer: one fault,
        said once; its nodes are unknown (not lost: nothing says they are), as a lost
        relay's are, until it answers again."""
        self._record("source_lost", source, reason)
        for node in self.nodes.values():
            if node.status != UNKNOWN or node.reason != reason:
                node.status = UNKNOWN
                node.reason = reason
                node.version += 1
        known = self.lost_sources.get(source)
        since = known[1] if known is not None else self.wall()
        self.lost_sources[source] = (reason, since, len(self.nodes))
        self.version += 1
        if known is None:
            self.events.appendleft(ClusterEvent(source, since, "source_lost", "critical",
                                                reason))

    def source_back(self, source: str) -> None:
        """The server answers again: its nodes come back with what it reads of them."""
        self._record("source_back", source)
        if self.lost_sources.pop(source, None) is not None:
            self.version += 1
            self.events.appendleft(ClusterEvent(source, self.wall(), "source_back", "info",
                                                f"{source} answers again"))

    def forget_relay_problems(self, relay: str) -> None:
        """A relay connected again: what it does now is judged anew."""
        self._record("forget_relay_problems", relay)
        if self.relay_problems.pop(relay, None):
            self.version += 1
        self._more_problems.pop(relay, None)

    def clear(self) -> None:
        """Forget every node and event (a replay seeking back rebuilds from the start)."""
        self.nodes.clear()
        self.events.clear()
        self.version += 1
        self.layout_version += 1
        self._hellos_version += 1

    def forget_target(self, target: str) -> None:
        """Drop a target that turned out not to be a node (a relay's own address)."""
        self._record("forget_target", target)
        self.names.release(target)
        if self.nodes.pop(target, None) is not None:
            self.version += 1
            self.layout_version += 1
            self._hellos_version += 1

    # -- what the viewer looks at closely -------------------------------------------
    # set_detail and set_drawn are view_state.ViewWants: the one thing a view writes here.

    def set_detail(self, targets: set[str] | frozenset[str]) -> None:
        """Take these nodes whole from now on, and the rest as overviews."""
        targets = frozenset(targets)
        if targets == self.detail_targets:
            return
        for gone in self.detail_targets - targets:
            node = self.nodes.get(gone)
            if node is not None and node.overview is not None:
                node.detail = None  # it goes stale from here on: not shown as current
        self.detail_targets = targets
        for listener in list(self._detail_listeners):
            listener(targets)
        self._tell_wants()

    def set_drawn(self, fields: frozenset[str] | None) -> None:
        """The fields the maps draw from now on (None: every field)."""
        if fields != self.drawn:
            self.drawn = fields
            self._tell_wants()

    def set_unasked(self, fields: frozenset[str]) -> None:
        """The fields a source that asks only what is drawn (tuimon prom) did not ask at
        its last read."""
        self.unasked = fields

    def asking(self, reads: frozenset[str]) -> bool:
        """Does a map that reads these fields wait for its source to ask them (it was
        switched to since the source last read)?"""
        return not self.unasked.isdisjoint(reads)

    def add_wants_listener(self, listener: Callable[[], None]) -> None:
        self._wants_listeners.append(listener)

    def remove_wants_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._wants_listeners:
            self._wants_listeners.remove(listener)

    def _tell_wants(self) -> None:
        for listener in list(self._wants_listeners):
            listener()

    def add_read_listener(self, listener: Callable[[], None]) -> None:
        self._read_listeners.append(listener)

    def remove_read_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._read_listeners:
            self._read_listeners.remove(listener)

    def read_applied(self) -> None:
        """A source has applied a whole read of its nodes (every node's sample of one
        refresh, or every node marked stale when the read failed): the views are told,
        to show it at once."""
        for listener in list(self._read_listeners):
            listener()

    def add_detail_listener(self, listener: Callable[[frozenset[str]], None]) -> None:
        self._detail_listeners.append(listener)

    def remove_detail_listener(self, listener: Callable[[frozenset[str]], None]) -> None:
        if listener in self._detail_listeners:
            self._detail_listeners.remove(listener)

    # -- sources call these -------------------------------------------------------

    def apply_message(self, target: str, message: Hello | Sample | Event | None,
                      raw: bytes = b"") -> None:
        """One node's decoded frame (raw is for sinks that forward bytes; unused here)."""
        if isinstance(message, Hello):
            self.apply_hello(target, message)
        elif isinstance(message, Sample):
            self.apply_sample(target, message)
        elif isinstance(message, Event):
            self.apply_event(target, message)

    def apply_source_state(self, source: str, state: str, reason: str | None) -> None:
        """A relay says how its connection to one node stands."""
        self._record("apply_source_state", source, state, reason)
        if state in LOST:
            self.mark_stale(source, reason or state)
        else:
            self.add_target(source)

    def apply_judgement(self, judgement: dict[str, Any], relay: str) -> None:
        """A relay's judgement of the nodes it carries (a batch's `judgement`, checked):
        what it holds, with the true onsets. Where every node is carried by relays that
        judge, the viewer shows theirs instead of judging itself (Diagnosis)."""
        self._record("apply_judgement", judgement, relay)
        self.relay_judgements[relay] = findings_from_judgement(judgement)
        self.version += 1

    def relayed_findings(self) -> list[Any] | None:
        """The relays' findings, where every node is carried by a relay that judges
        (None: the viewer judges, as it does without relays or with older ones)."""
        judging = self.relay_judgements
        if not judging or not self.nodes or any(
                n.owner not in judging for n in self.nodes.values()):
            return None
        out: list[Any] = []
        for relay, findings in judging.items():
            lost = self.lost_relays.get(relay)
            if lost is None:
                out += findings
                continue
            # Its relay is gone: what it last held is kept, as unknown.
            note = no_data_note(lost[1], f"relay {relay} unreachable")
            out += [replace(f, message=f.message + note) for f in findings]
        return out

    def apply_budget(self, budget: dict[str, dict[str, Any]], source: str = "") -> None:
        """A ledger's summary per job, from `source` (a relay, Prometheus): it replaces
        what that source said before, so a source that names new jobs every batch holds
        at most one batch's worth (MAX_BUDGET_JOBS) in the viewer."""
        if self._budgets_by_source.get(source) != budget:
            self._record("apply_budget", budget, source)
        self._budgets_by_source[source] = budget
        merged: dict[str, dict[str, Any]] = {}
        for per_source in self._budgets_by_source.values():
            merged.update(per_source)
        self.budgets = merged
        self.version += 1

    def apply_hello(self, target: str, hello: Hello) -> None:
        node = self.add_target(target)
        for changed in self.names.claim(target, hello.node):
            self._refuse_name(changed)
        if self.names.refused(target) is not None:
            return  # its frames are not merged into the node whose name it says
        rebooted = node.hello is not None and hello.boot_id and node.hello.boot_id not in (
            None, hello.boot_id)
        if node.hello is None or node.name != hello.node or \
                len(node.hello.gpus) != len(hello.gpus):
            self.layout_version += 1
        node.hello = hello
        node.port_ids = hello_port_ids(hello)
        node._levels.clear()  # levels are relative to the hello's facts
        self._hellos_version += 1
        node.name = hello.node
        self._seen(node)
        if rebooted:
            self._event(node, ClusterEvent(node.name, self.wall(), "node_rebooted", "warning",
                                           f"{node.name} rebooted (boot id changed)"))

    def apply_sample(self, target: str, sample: Sample) -> None:
        node = self.add_target(target)
        if self.names.refused(target) is not None:
            return
        node.sample = sample
        extra = sample.extra
        steps = extra.get("steps")
        if steps:
            node.pending_steps = merge_steps(node.pending_steps, steps)
        if sample.dropped:
            node.dropped = sample.dropped
        full = sample.gpus is not None
        if full:
            node.detail = sample
        elif ("overview" in extra and node.detail is not None
              and target not in self.detail_targets):
            # A whole sample sent before the agent heard that this viewer wants overviews
            # (its first, at connect): stale from here on, as after a screen closes. (A
            # sample without GPUs and without an overview, a GPU collector failing, keeps
            # it: a readout reads the host and the ports there.)
            node.detail = None
        overview = extra.get("overview")
        built = overview is None and (full or "fabric" in extra or "storage" in extra)
        if built:  # an agent without overviews: its levels as a map reads them
            overview = build_overview(node.hello, sample, levels=False)
        if overview is not None:
            node.overview = overview
            node.levels_from = sample if built else None
            node._levels.clear()
            percents = busy(overview)
            if percents is not None:
                node.busy_hist.append(percents)
        node.conditions = extra.get("findings")
        self._seen(node)

    def apply_event(self, target: str, event: Event) -> None:
        node = self.add_target(target)
        if self.names.refused(target) is not None:
            return
        if event.kind == "xid":
            node.xids += 1
        self._event(node, ClusterEvent(node.name, event.ts, event.kind, event.severity,
                                       event.message, event.gpu))
        self._seen(node)

    def finding_event(self, finding: Any, raised: bool, ts: float) -> None:
        """A finding raised (its severity) or cleared (info) as an event of its node, or
        of what it names (a leaf, a job)."""
        self.events.appendleft(ClusterEvent(
            finding.node or finding.where, ts, finding.kind,
            finding.severity if raised else "info",
            finding.message if raised else f"cleared: {finding.message}", finding.gpu))
        self.version += 1

    # -- what a source that reads the whole cluster at once asks (sources.PromSink) --

    def known_targets(self) -> Collection[str]:
        return self.nodes.keys()

    def up_targets(self) -> list[str]:
        return [t for t, node in self.nodes.items() if node.status == UP]

    def holds_sample(self, target: str) -> bool:
        """Is the node up, with its latest whole sample held (not its overview only)?"""
        node = self.nodes.get(target)
        return node is not None and node.status == UP and node.detail is not None

    def source_is_lost(self, source: str) -> bool:
        return source in self.lost_sources

    def set_scrape_failures(self, failures: dict[str, tuple[str, str]]) -> None:
        """The Prometheus targets whose last scrape failed, replacing the last set:
        "job instance" -> (node, reason)."""
        self._record("set_scrape_failures", {k: list(v) for k, v in failures.items()})
        self.scrape_failures = dict(failures)

    def mark_current(self, targets: list[str]) -> None:
        """The source heard for these nodes, and they are as they were (a Prometheus
        node its server has not scraped anew): seen now, with no new sample, so a node
        lost later is stale for its recent last word, not down for an old one."""
        self._record("mark_current", targets)
        now = self.clock()
        for target in targets:
            node = self.nodes.get(target)
            if node is not None and node.status == UP:
                node.last_seen = now

    def mark_stale(self, target: str, reason: str) -> None:
        self._record("mark_stale", target, reason)
        node = self.add_target(target)
        was = node.status
        node.reason = reason
        node.status = lost_state(node.last_seen, self.clock())
        node.version += 1
        self.version += 1
        if was in (UP, UNKNOWN):  # unknown: its relay is back and says it is lost
            self._event(node, ClusterEvent(node.name, self.wall(), "node_lost", "critical",
                                           f"{node.name}: lost contact: {reason}"))

    def _refuse_name(self, target: str) -> None:
        """A target that says a node name another holds (tuimon_core.identity): nothing
        it sent is kept, it is shown under its own address with the reason, once."""
        node = self.nodes.get(target)
        if node is None:
            return
        node.hello = node.sample = node.detail = node.levels_from = None
        node.overview = node.conditions = node.pending_steps = None
        node.port_ids = []
        node._levels.clear()
        node.name = clean(_name_of(target))
        node.reason = self.names.message(target)
        if node.status != STALE:
            node.status = STALE
            self._event(node, ClusterEvent(node.name, self.wall(), "duplicate_name",
                                           "warning", f"{node.name}: {node.reason}"))
        node.version += 1
        self.version += 1
        self.layout_version += 1
        self._hellos_version += 1

    def note_protocol_error(self, target: str, reason: str) -> None:
        self.protocol_errors += 1
        self.mark_stale(target, f"bad frame: {reason}")

    # -- housekeeping ---------------------------------------------------------------

    def refresh_ages(self) -> None:
        """Stale nodes become down (tuimon_core.timing); call about once a second."""
        now = self.clock()
        for node in self.nodes.values():
            state = aged_state(node.status, node.last_seen, now)
            if state != node.status:
                node.status = state
                node.version += 1
                self.version += 1

    @property
    def hellos_version(self) -> int:
        """Bumped with every hello and node come or gone: what reads hellos caches by."""
        return self._hellos_version

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATES, 0)
        for node in self.nodes.values():
            out[node.status] += 1
        return out

    def gpu_total(self) -> int:
        return self._from_hellos()[0]

    def interval(self) -> float | None:
        return self._from_hellos()[1]

    def _from_hellos(self) -> tuple[int, float | None]:
        """GPUs and the shortest interval: they change only with a hello (or a node
        coming or going), and the header asks every second of every node."""
        if self._hellos_read[0] != self._hellos_version:
            intervals = [n.hello.interval for n in self.nodes.values() if n.hello]
            self._hellos_read = (self._hellos_version, (
                sum(n.gpu_count for n in self.nodes.values()),
                min(intervals) if intervals else None))
        return self._hellos_read[1]

    def _seen(self, node: NodeState) -> None:
        if node.status != UP:
            if node.status in LOST and node.last_seen is not None:
                self._event(node, ClusterEvent(node.name, self.wall(), "node_back", "info",
                                               f"{node.name}: back"))
            node.status = UP
            node.reason = None
        node.last_seen = self.clock()
        node.version += 1
        self.version += 1

    def _event(self, node: NodeState, event: ClusterEvent) -> None:
        self.events.appendleft(event)
        self.version += 1
