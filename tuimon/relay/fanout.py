"""The relay's middle: the latest state of every upstream node, and what each viewer is
still owed.

Frames from agents arrive one node at a time; viewers get them in batches, at their own
interval, restricted to the nodes and families they subscribed to. A viewer is owed at
most one sample per node (a newer one replaces the older, and the step sums of the two
are added so no training time is lost), the latest hello per node, and a bounded list of
events: a slow viewer costs the relay a fixed amount of memory, never a growing queue.
Frames are forwarded as the agent's own bytes unless the viewer asked for fewer
families, and each filtered encoding is made once and shared.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import msgpack

from tuimon.model.attribution import concerning, stop_cause
from tuimon.model.judge_config import JudgeConfig
from tuimon.model.step_credit import JobCredit, JobGrant, StepCredit, merge_steps
from tuimon.relay.judging import RelayJudge
from tuimon_core.findings import Finding
from tuimon_core.findings_family import findings_to_wire
from tuimon_core.hostlist import expand_hostlists
from tuimon_core.node_rules import NodeRules
from tuimon_core.overview import OVERVIEW_FAMILIES, build_overview, hello_port_ids
from tuimon_core.protocol import (
    Batch,
    Event,
    Hello,
    ProtocolError,
    Sample,
    decode,
    encode,
    encode_map,
    unpack,
)
from tuimon_core.protocol.codec import map_header, sample_spans
from tuimon_core.protocol.families import FAMILY_KEYS, Frame, keep_families, wants_events
from tuimon_core.protocol.fields import MAX_DETAIL
from tuimon_core.protocol.overview_layout import OVERVIEW_FORM, first_form
from tuimon_core.timing import aged_state, lost_state

log = logging.getLogger(__name__)
# A node that has not reported a job within this long of the job's last report is no
# longer one of its nodes (the job restarted elsewhere).
JOB_NODES_S = 600.0
# How long the nodes a job ran on are remembered: as long as a stop can last.
JOB_SOURCES_KEEP_S = 86400.0

# One batch message stays under this many bytes of frames; more makes another message.
BATCH_BYTES = 1 << 20
MAX_VIEWER_EVENTS = 1000


_AS_SENT = object()
_pack = partial(msgpack.packb, use_bin_type=True)


# The sample keys each family owns, to drop for a subscriber without that family.
_FAMILY_OF_KEY = {key: family for family, key in FAMILY_KEYS.items()}


_FAMILIES_IN: dict[tuple[str, ...], frozenset[str]] = {}


def _families_in(keys: tuple[str, ...]) -> frozenset[str]:
    """The families a sample with these top-level keys carries (frames of one agent
    version share their keys: a small cache)."""
    found = _FAMILIES_IN.get(keys)
    if found is None:
        if len(_FAMILIES_IN) > 256:
            _FAMILIES_IN.clear()
        found = _FAMILIES_IN[keys] = frozenset(
            _FAMILY_OF_KEY[k] for k in keys if k in _FAMILY_OF_KEY)
    return found


class SampleFrame:
    """A sample as the agent's bytes. The relay read only its envelope, steps and findings
    (`decode(deep=False)`, which also says where each top-level key's bytes lie), so an
    encoding with fewer families is the agent's own bytes of the families kept, under a
    new map header: nothing decoded, nothing encoded again. Only step sums merged from
    samples it replaced, and the overview the relay built for an agent that predates
    overviews (`added`), are encoded here. Each encoding is made once per family set.
    A viewer that reads only the overview's first form gets it re-encoded (the slow,
    general way: such viewers are the exception), naming the hello's `port_ids`."""

    __slots__ = ("_cache", "_first", "added", "message", "port_ids", "raw", "steps")

    def __init__(self, message: Sample, raw: bytes, steps: Any = _AS_SENT,
                 added: dict[str, Any] | None = None,
                 port_ids: list[str] | None = None) -> None:
        self.message = message
        self.raw = raw
        self.steps = steps
        self.added = added
        self.port_ids = port_ids or []
        self._cache: dict[frozenset[str] | None, bytes] = {}
        self._first: dict[frozenset[str] | None, bytes] | None = None

    def steps_sent(self) -> dict[str, Any] | None:
        return self.message.extra.get("steps") if self.steps is _AS_SENT else self.steps

    def encoded(self, families: frozenset[str] | None, form: int = OVERVIEW_FORM) -> bytes:
        if form < OVERVIEW_FORM and self._sends_overview(families):
            return self._first_form(families)
        data = self._cache.get(families)
        if data is None:
            if self.steps is _AS_SENT and not self.added and (
                    families is None or self._within(families)):
                data = self.raw  # nothing to leave out: the agent's bytes as they came
            else:
                data = self._encode(families)
            self._cache[families] = data
        return data

    def _sends_overview(self, families: frozenset[str] | None) -> bool:
        if families is not None and "overview" not in families:
            return False
        keys = self.message.keys
        return bool(self.added) or (
            "overview" in keys if keys is not None else "overview" in self.message.extra)

    def _first_form(self, families: frozenset[str] | None) -> bytes:
        if self._first is None:
            self._first = {}
        data = self._first.get(families)
        if data is None:
            wire = unpack(self.raw)
            wire.update(self.added or {})
            if self.steps is not _AS_SENT:
                wire["steps"] = self.steps
            keep_families(wire, families)
            if "overview" in wire:
                wire["overview"] = first_form(wire["overview"], self.port_ids)
            data = self._first[families] = encode_map(wire)
        return data

    def _within(self, families: frozenset[str]) -> bool:
        keys = self.message.keys
        return keys is not None and _families_in(keys) <= families

    def _encode(self, families: frozenset[str] | None) -> bytes:
        spans = self.message.spans
        if spans is None and self.message.keys is not None:
            spans = self.message.spans = sample_spans(self.raw)
        replaced = dict(self.added or {})
        if self.steps is not _AS_SENT:
            replaced["steps"] = self.steps
        if spans is None:  # not read by the envelope path: the slow, general way
            wire = unpack(self.raw)
            wire.update(replaced)
            return encode_map(keep_families(wire, families))
        parts = []
        for key, (start, end) in spans.items():
            family = _FAMILY_OF_KEY.get(key)
            if key in replaced or (families is not None and family is not None
                                   and family not in families):
                continue
            parts.append(self.raw[start:end])
        for key, value in replaced.items():
            family = _FAMILY_OF_KEY.get(key)
            if value is not None and (families is None or family is None or family in families):
                parts.append(_pack(key) + _pack(value))
        return map_header(len(parts)) + b"".join(parts)


@dataclass(slots=True)
class Source:
    """One upstream node, as the relay last saw it."""

    name: str  # the target the relay connects to, e.g. gpu001:9477
    state: str = "connecting"
    reason: str | None = None
    node: str | None = None  # the hello's node name
    hello: Frame | None = None
    port_ids: list[str] = field(default_factory=list)  # the hello's fabric ports
    sample: SampleFrame | None = None
    last_seen: float | None = None  # monotonic
    frames: int = 0
    owner: str | None = None  # the upstream relay that carries it; None: a direct target
    # What the node's own rules found in its latest sample (its `findings` family).
    conditions: list[dict[str, Any]] | None = None
    # The relay's own rules for a node whose agent predates findings.
    rules: NodeRules | None = None

    def names(self) -> tuple[str, ...]:
        host = self.name.rsplit(":", 1)[0]
        return (self.name, host, self.node) if self.node else (self.name, host)


def _lacks_overview(message: Sample) -> bool:
    """A full sample without an overview: an agent that predates them."""
    if message.keys is not None:
        return "gpus" in message.keys and "overview" not in message.keys
    return message.gpus is not None and "overview" not in message.extra


def _declared(chunk: list[tuple[str, bytes]],
              owed: dict[str, tuple[str, str, str | None]]) -> list[tuple[str, str, str | None]]:
    """The owed states of the nodes this chunk has frames for, taken from `owed`."""
    out = []
    for name, _ in chunk:
        state = owed.pop(name, None)
        if state is not None:
            out.append(state)
    return out


def _entry(entries: list[tuple[str, bytes]], name: str, encoded: Callable[..., bytes],
           *args: Any) -> None:
    """One node's frame for a batch, alone: a frame the relay cannot encode (a bug, or
    values it cannot pack) is left out and logged, never the viewer's whole batch."""
    try:
        entries.append((name, encoded(*args)))
    except Exception:
        log.exception("relay: cannot encode a frame of %s; left out of the batch", name)


def _fair_share(lists: list[list[str]], limit: int) -> set[str]:
    """At most `limit` names from several viewers' lists, taken in turns, so that each
    viewer keeps some of what it looks at when together they want more."""
    out: set[str] = set()
    for column in itertools.zip_longest(*lists):
        for name in column:
            if name is not None and len(out) < limit:
                out.add(name)
        if len(out) >= limit:
            break
    return out


@dataclass(frozen=True, slots=True)
class Shared:
    """What the relay sends every viewer alike when it changes (its judgement): the
    value, and a number that moves when it does, so each viewer is sent it once."""

    value: dict[str, Any]
    seq: int


class ViewerFeed:
    """What one viewer subscribed to and what it is still owed."""

    def __init__(self, peer: str, interval: float) -> None:
        self.peer = peer
        self.default_interval = interval
        self.interval = interval
        self.families: frozenset[str] | None = None
        self.form = 1  # the overview form it reads (overview_forms.py)
        self.nodes: frozenset[str] | None = None
        # Sources this viewer takes with every family whatever `families` says.
        self.detail: frozenset[str] = frozenset()
        self.hellos: dict[str, Frame] = {}
        self.samples: dict[str, SampleFrame] = {}
        self.events: deque[tuple[str, Frame]] = deque()
        self.states: dict[str, tuple[str, str | None]] = {}
        self.dropped = 0
        self.budget_seq = -1
        self.judgement_seq = -1
        self.batches = 0
        self.bytes = 0

    def subscribe(self, interval: float | None, families: list[str] | None,
                  nodes: list[str] | None, detail: list[str] | None = None,
                  overview_form: int | None = None) -> bool:
        """Take a subscription; True when more than the detail changed (the viewer is
        then owed the whole picture again; a new detail only the detailed nodes)."""
        before = (self.interval, self.families, self.nodes, self.form)
        self.form = overview_form or 1
        self.interval = max(self.default_interval, interval or self.default_interval)
        self.families = frozenset(families) if families is not None else None
        if nodes is None:
            self.nodes = None
        else:
            # Counted before expanded, all items together: a small subscribe cannot make
            # the relay build millions of names (tuimon.sources.targets).
            self.nodes = frozenset(expand_hostlists(nodes))
        self.detail = frozenset(detail or ())
        return before != (self.interval, self.families, self.nodes, self.form)

    def families_for(self, name: str) -> frozenset[str] | None:
        return None if name in self.detail else self.families

    def wants(self, source: Source) -> bool:
        return self.nodes is None or any(n in self.nodes for n in source.names())

    def wants_events(self) -> bool:
        return wants_events(self.families)

    def offer_state(self, source: Source) -> None:
        self.states[source.name] = (source.state, source.reason)

    def offer_hello(self, source: Source) -> None:
        assert source.hello is not None
        self.hellos[source.name] = source.hello
        # Samples after a hello follow its inventory: an older one would be misread.
        self.samples.pop(source.name, None)

    def offer_sample(self, name: str, frame: SampleFrame) -> None:
        older = self.samples.get(name)
        if older is not None:
            old_steps = older.steps_sent()
            if old_steps:
                steps = merge_steps(old_steps, frame.steps_sent())
                frame = SampleFrame(frame.message, frame.raw, steps, frame.added,
                                    frame.port_ids)
        self.samples[name] = frame

    def offer_event(self, name: str, frame: Frame) -> None:
        if len(self.events) >= MAX_VIEWER_EVENTS:
            self.events.popleft()
            self.dropped += 1
        self.events.append((name, frame))

    def take(self, ts: float, relay: str, budget: dict[str, dict[str, Any]] | None,
             budget_seq: int, judgement: Shared | None = None) -> Iterator[bytes]:
        """Everything owed, as one or more encoded batch messages (always at least one:
        an empty batch tells the viewer the relay is alive). What is owed is taken at
        once; the messages are encoded one at a time as the caller sends them, so a
        snapshot of thousands of nodes never sits in memory encoded whole."""
        entries: list[tuple[str, bytes]] = []
        families, detail, form = self.families, self.detail, self.form
        for name, frame in self.hellos.items():
            _entry(entries, name, frame.encoded, families)
        for name, frame in self.events:
            _entry(entries, name, frame.encoded, families)
        for name, sample_frame in self.samples.items():
            _entry(entries, name, sample_frame.encoded,
                   None if name in detail else families, form)
        states = [(name, state, reason) for name, (state, reason) in self.states.items()]
        self.hellos.clear()
        self.events.clear()
        self.samples.clear()
        self.states.clear()
        send_budget = budget if budget is not None and budget_seq != self.budget_seq else None
        self.budget_seq = budget_seq
        send_judgement = None
        if judgement is not None and judgement.seq != self.judgement_seq:
            send_judgement = judgement.value
            self.judgement_seq = judgement.seq
        return self._messages(ts, relay, entries, states, send_budget, send_judgement)

    def _messages(self, ts: float, relay: str, entries: list[tuple[str, bytes]],
                  states: list[tuple[str, str, str | None]],
                  budget: dict[str, dict[str, Any]] | None,
                  judgement: dict[str, Any] | None = None) -> Iterator[bytes]:
        """Batches of at most BATCH_BYTES of frames. A viewer accepts a node's frames only
        from a relay that declared the node (announced its state) in the same or an
        earlier batch, so each message carries the states of the nodes its frames are
        for; the last carries the rest, and the budget."""
        owed = {name: (name, state, reason) for name, state, reason in states}
        chunk: list[tuple[str, bytes]] = []
        size = 0
        for entry in entries:
            if chunk and size + len(entry[1]) > BATCH_BYTES:
                yield self._count(self._encode(ts, relay, chunk, _declared(chunk, owed), None))
                chunk, size = [], 0
            chunk.append(entry)
            size += len(entry[1])
        yield self._count(self._encode(ts, relay, chunk, list(owed.values()), budget,
                                       judgement))

    def _count(self, data: bytes) -> bytes:
        self.batches += 1
        self.bytes += len(data)
        return data

    def _encode(self, ts: float, relay: str, frames: list[tuple[str, bytes]],
                states: list[tuple[str, str, str | None]],
                budget: dict[str, dict[str, Any]] | None,
                judgement: dict[str, Any] | None = None) -> bytes:
        batch = Batch(ts=ts, frames=frames, sources=states, budget=budget, relay=relay,
                      dropped=self.dropped, judgement=judgement)
        return encode_map(batch.to_wire())


@dataclass
class RelayStats:
    frames_in: int = 0
    bad_frames: int = 0
    steps_reports: int = 0


class FanOut:
    """The relay's sink for upstream streams (`tuimon.sources.agent_stream.StreamSink`)
    and the set of viewer feeds."""

    def __init__(self, on_steps: Callable[..., None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 on_totals: Callable[[str, dict[str, Any], float, JobCredit, JobGrant],
                                     None] | None = None,
                 on_ended: Callable[[str, float], None] | None = None,
                 judge: RelayJudge | None = None) -> None:
        self.sources: dict[str, Source] = {}
        self.viewers: set[ViewerFeed] = set()
        self.on_steps = on_steps
        # (source, a job's entry of its steps family, now): the agent's cumulative sums,
        # from which the ledger recovers what it missed while this relay was away.
        self.on_totals = on_totals
        # (job, when): its ranks said the run is complete.
        self.on_ended = on_ended
        # job -> source -> when it last reported the job (the wall clock, as the ledger's
        # minutes): the job's nodes, kept JOB_SOURCES_KEEP_S (forget_jobs).
        self.job_sources: dict[str, dict[str, float]] = {}
        self.clock = clock
        self.wall = wall
        self.stats = RelayStats()
        # Each (job, rank) counted from one node only, and never more than real time.
        self.credit = StepCredit()
        # job -> the nodes that said their ranks of it are done (StepReporter.finish)
        self._ended_by: dict[str, set[str]] = {}
        # The relay's own judgement of every node it carries (tuimon.relay.judging): its
        # findings are what /metrics, the viewers, the ledger's causes and its episodes
        # read.
        self.judge = judge if judge is not None else RelayJudge(JudgeConfig(), wall, clock)
        self.findings: list[Finding] = []
        # Which target holds each node name: the model's (what it refuses, this drops).
        self.names = self.judge.cluster.names
        self._problems_logged: set[tuple[str, str]] = set()
        self._detail_over = 0  # nodes asked for in detail beyond what an upstream takes

    # -- viewers --------------------------------------------------------------------

    def attach(self, feed: ViewerFeed) -> None:
        self.viewers.add(feed)
        self.refill(feed)

    def detach(self, feed: ViewerFeed) -> None:
        self.viewers.discard(feed)

    def refill(self, feed: ViewerFeed) -> None:
        """Owe a viewer the current picture of every node it wants (on connect and on a
        new subscription), so it does not wait a full interval to see the cluster."""
        feed.hellos.clear()
        feed.samples.clear()
        feed.states.clear()
        for source in self.sources.values():
            if not feed.wants(source):
                continue
            feed.offer_state(source)
            if source.hello is not None:
                feed.offer_hello(source)
            if source.sample is not None and source.state == "up":
                feed.offer_sample(source.name, source.sample)

    def refill_detail(self, feed: ViewerFeed, names: Iterable[str]) -> None:
        """Owe a viewer the latest sample of the nodes it now looks at closely: every
        value if the relay has them, else the overview until the agent sends them."""
        for name in names:
            source = self.sources.get(name)
            if source is not None and source.sample is not None and feed.wants(source):
                feed.offer_sample(name, source.sample)

    def _feeds(self, source: Source) -> Iterable[ViewerFeed]:
        return [f for f in self.viewers if f.nodes is None or f.wants(source)]

    # -- StreamSink -----------------------------------------------------------------

    def add_target(self, target: str) -> Source:
        source = self.sources.get(target)
        if source is None:
            source = self.sources[target] = Source(target)
            for feed in self._feeds(source):
                feed.offer_state(source)
        return source

    def claim(self, source: str, relay: str) -> bool:
        """May upstream `relay` speak for `source`? Not for one of this relay's own
        targets, nor for a node another upstream relay carries."""
        known = self.sources.get(source)
        if known is None:
            self.add_target(source).owner = relay
            return True
        return known.owner == relay

    def owner_of(self, source: str) -> str | None:
        known = self.sources.get(source)
        return known.owner if known is not None else None

    def note_relay_problem(self, relay: str, key: str, text: str | None) -> None:
        """An upstream relay's problem: logged once (the viewers of this relay see the
        nodes it refused as not declared)."""
        if text is not None and (relay, key) not in self._problems_logged and \
                len(self._problems_logged) < 4096:  # then silent: said often enough
            self._problems_logged.add((relay, key))
            log.warning("%s", text)

    def relay_lost(self, relay: str, sources: set[str] | frozenset[str], reason: str) -> None:
        """An upstream relay is unreachable: its nodes go stale with that reason (the
        wire's states have no "unknown"; this relay's viewers read the reason)."""
        for source in sources:
            self.mark_stale(source, f"relay {relay} unreachable: {reason}")

    def relay_back(self, relay: str) -> None:
        """An upstream relay answers again: its nodes come back with their frames."""

    def forget_relay_problems(self, relay: str) -> None:
        self._problems_logged = {p for p in self._problems_logged if p[0] != relay}

    def forget_target(self, target: str) -> None:
        # An upstream relay is not a node; viewers never heard of it as one.
        self.sources.pop(target, None)
        self.judge.cluster.forget_target(target)
        for feed in self.viewers:
            feed.states.pop(target, None)

    def apply_message(self, target: str, message: Hello | Sample | Event | None,
                      raw: bytes = b"") -> None:
        if message is None:
            return
        source = self.add_target(target)
        # The relay's model takes every frame first: it holds the node names (the one
        # identity rule, tuimon_core.identity) and refuses what a duplicate sends.
        self.judge.cluster.apply_message(target, message)
        if isinstance(message, Hello):
            for refused in self.names.duplicates:
                known = self.sources.get(refused)
                if known is not None and (known.hello is not None or refused == target):
                    self._refuse_name(refused)
        if self.names.refused(target) is not None:
            return  # says a node name another target holds: neither kept nor sent on
        self.stats.frames_in += 1
        source.frames += 1
        source.last_seen = self.clock()
        if source.state != "up":
            self._set_state(source, "up", None)
        if isinstance(message, Sample):
            raw = raw or encode(message)
            added = None
            if _lacks_overview(message):
                try:
                    added = self._upgrade(source, raw)
                except ProtocolError as exc:
                    self.note_protocol_error(target, exc.reason)
                    return
            sample = SampleFrame(message, raw, added=added, port_ids=source.port_ids)
            source.sample = sample
            source.conditions = (added or message.extra).get("findings")
            self._count_steps(target, message)
            for feed in self._feeds(source):
                feed.offer_sample(target, sample)
            return
        frame = Frame(message, raw)
        if isinstance(message, Hello):
            source.hello = frame
            source.node = message.node
            source.port_ids = hello_port_ids(message)
            for feed in self._feeds(source):
                feed.offer_hello(source)
        else:
            for feed in self._feeds(source):
                if feed.wants_events():
                    feed.offer_event(target, frame)

    def _refuse_name(self, target: str) -> None:
        """A target that says a node name another holds (tuimon_core.identity): what it
        sent is dropped, and its viewers told why, under its own address."""
        source = self.sources.get(target)
        if source is None:
            return
        source.hello = source.sample = None
        source.node = source.conditions = source.rules = None
        source.port_ids = []
        self._set_state(source, "stale", self.names.message(target))

    def mark_stale(self, target: str, reason: str) -> None:
        source = self.add_target(target)
        self._set_state(source, lost_state(source.last_seen, self.clock()), reason)
        self.judge.cluster.mark_stale(target, reason)

    def note_protocol_error(self, target: str, reason: str) -> None:
        self.stats.bad_frames += 1
        self.mark_stale(target, f"bad frame: {reason}")

    def apply_source_state(self, source: str, state: str, reason: str | None) -> None:
        # A relay upstream of this one says how its node stands: pass it on.
        self._set_state(self.add_target(source), state, reason)
        self.judge.cluster.apply_source_state(source, state, reason)

    def apply_budget(self, budget: dict[str, dict[str, Any]], source: str = "") -> None:
        """An upstream relay's ledger; this relay keeps its own from the same steps."""

    def apply_judgement(self, judgement: dict[str, Any], relay: str) -> None:
        """An upstream relay's judgement: this relay judges what it sees itself, the
        upstream's nodes among them (its viewers read this relay's)."""

    def refresh(self) -> None:
        """Stale sources become down (tuimon_core.timing), and the relay judges every node
        it carries (its findings); call about once a second."""
        now = self.clock()
        for source in self.sources.values():
            self._set_state(source, aged_state(source.state, source.last_seen, now),
                            source.reason)
        self.findings = self.judge.update()

    # -- what to ask upstream for -----------------------------------------------------

    def upstream_families(self, name: str) -> frozenset[str] | None:
        """The families to ask one agent for (None: all): what the relay needs itself
        (overviews, findings, step sums, events) and what its viewers want of the node.
        A viewer that takes every family of every node (one that predates overviews),
        or looks at this node closely, makes it all."""
        source = self.sources.get(name)
        wanted = set(OVERVIEW_FAMILIES)
        for feed in self.viewers:
            if source is not None and not feed.wants(source):
                continue
            if feed.families is None or name in feed.detail:
                return None
            wanted |= feed.families
        return frozenset(wanted)

    def relay_subscription(self) -> tuple[frozenset[str] | None, frozenset[str]]:
        """The families and the detail to ask an upstream relay for: the union of what
        this relay's viewers ask."""
        families: set[str] | None = set(OVERVIEW_FAMILIES)
        for feed in self.viewers:
            if families is not None:
                if feed.families is None:
                    families = None
                else:
                    families |= feed.families
        detail = _fair_share([sorted(feed.detail) for feed in self.viewers], MAX_DETAIL)
        wanted = len(set().union(*(feed.detail for feed in self.viewers)))
        if wanted > len(detail) and wanted != self._detail_over:
            # An upstream refuses more (and would close the connection): each viewer keeps
            # a share, the rest of its nodes come as overviews until a place frees.
            log.warning("relay: viewers look closely at %d nodes; an upstream relay takes "
                        "%d, the rest come as overviews", wanted, MAX_DETAIL)
        self._detail_over = wanted if wanted > len(detail) else 0
        return (None if families is None else frozenset(families)), frozenset(detail)

    def _upgrade(self, source: Source, raw: bytes) -> dict[str, Any] | None:
        """The overview and findings of an agent that predates them, made here from its
        full sample (decoded and checked: these values are read, not just forwarded)."""
        full = decode(raw)
        if not isinstance(full, Sample) or full.gpus is None:
            return None
        hello = source.hello.message if source.hello is not None else None
        if source.rules is None:
            source.rules = NodeRules(source.node or source.name)
        now = self.clock()
        source.rules.observe(hello, full, now)
        return {"overview": build_overview(hello, full),
                "findings": findings_to_wire(source.rules.conditions(now))}

    # -- internals ------------------------------------------------------------------

    def _set_state(self, source: Source, state: str, reason: str | None) -> None:
        if (source.state, source.reason) == (state, reason):
            return
        source.state, source.reason = state, reason
        for feed in self._feeds(source):
            feed.offer_state(source)

    def _count_steps(self, source: str, sample: Sample) -> None:
        steps = sample.extra.get("steps")
        if not steps or self.on_steps is None:
            return
        self.stats.steps_reports += 1
        # The ledger's minutes are the relay's own (receive time), never the agent's.
        wall_now = self.wall()
        now = self.clock()
        credited = {job.job: job for job in self.credit.credit(source, steps, now)}
        for job in credited.values():
            self.job_sources.setdefault(job.job, {})[source] = wall_now
            # Ledger.add: run seconds, what they waited on, and samples per rank-second.
            self.on_steps(job.job, wall_now, job.total_s, job.effective_s, job.waits_s,
                          float(job.samples), job.wall)
        for entry in steps.get("jobs") or ():
            mine = credited.get(entry["id"])  # only the ranks this source may speak for
            if mine is not None and self.on_totals is not None and \
                    entry.get("total") is not None:
                self.on_totals(source, entry, wall_now, mine,
                               self.credit.grant(mine.job, now))
            # After this sample's last steps: a node that runs the job says its ranks are
            # done; the run is complete once every node it ran on lately has said so.
            if not entry.get("ended"):
                if mine is not None and entry["id"] in self._ended_by:
                    self._ended_by[entry["id"]].discard(source)  # it runs again
            elif self.on_ended is not None and self.credit.held(source, entry["id"]):
                ended = self._ended_by.setdefault(entry["id"], set())
                ended.add(source)
                if ended >= set(self._lately(entry["id"])):
                    del self._ended_by[entry["id"]]
                    self.on_ended(entry["id"], wall_now)

    def _lately(self, job: str, before: float = math.inf) -> dict[str, float]:
        """The sources that reported a job within JOB_NODES_S of its last report (before
        `before`): the nodes it runs on, not those it left after a restart."""
        sources = self.job_sources.get(job, {})
        newest = max((t for t in sources.values() if t < before), default=None)
        if newest is None:
            return {}
        return {s: t for s, t in sources.items() if t >= newest - JOB_NODES_S}

    def job_nodes(self, job: str) -> tuple[set[str], list[str]]:
        """The nodes a job ran on lately, and those of them whose agents are lost now."""
        nodes: set[str] = set()
        lost: list[str] = []
        for name in self._lately(job):
            source = self.sources.get(name)
            if source is None:
                continue
            node = source.node or source.name
            nodes.add(node)
            if source.state in ("stale", "down"):
                lost.append(node)
        return nodes, lost

    def job_findings(self, job: str) -> list[Finding]:
        """The findings this relay holds that concern a job (on its nodes, or the
        cluster's)."""
        return concerning(self.findings, job, self.job_nodes(job)[0])

    def jobs_touched(self, finding: Finding) -> list[str]:
        """The jobs a finding concerns now: those running on a node it names (or any of
        its nodes), or every job where it names no node (a file system, the spine)."""
        return [job for job in self.job_sources
                if concerning([finding], job, self.job_nodes(job)[0])]

    def stop_cause(self, job: str) -> str:
        """What a job falling silent now is put down to (tuimon.model.attribution)."""
        nodes, lost = self.job_nodes(job)
        return stop_cause(lost, concerning(self.findings, job, nodes))

    def returned(self, job: str, since: float) -> bool:
        """Whether every node the job ran on before `since` (the wall clock) has reported
        it again since: their agents' totals have then said what ran while it seemed
        stopped."""
        before = self._lately(job, since)
        return all(self.job_sources[job][name] >= since for name in before)

    def forget_jobs(self, older_than: float) -> None:
        """Drop the nodes that have not reported a job for `older_than` seconds."""
        now = self.wall()
        for job in list(self.job_sources):
            sources = {s: t for s, t in self.job_sources[job].items() if now - t <= older_than}
            if sources:
                self.job_sources[job] = sources
            else:
                del self.job_sources[job]
                self._ended_by.pop(job, None)

    def counts(self) -> dict[str, int]:
        out = {"connecting": 0, "up": 0, "stale": 0, "down": 0}
        for source in self.sources.values():
            out[source.state] = out.get(source.state, 0) + 1
        return out
