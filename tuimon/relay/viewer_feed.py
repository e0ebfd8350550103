"""What one viewer of the relay subscribed to and is still owed, taken as batches: at
most one sample per node (a newer one replaces the older, their step sums added), the
latest hello per node and a bounded list of events, so that a slow viewer costs a fixed
amount of memory, never a growing queue."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tuimon.model.step_credit import merge_steps
from tuimon.relay.sample_frame import SampleFrame
from tuimon.relay.upstream import Source
from tuimon_core.hostlist import expand_hostlists
from tuimon_core.protocol import Batch, encode_map
from tuimon_core.protocol.families import Frame, wants_events

log = logging.getLogger("tuimon.relay.fanout")

# One batch message stays under this many bytes of frames; more makes another message.
BATCH_BYTES = 1 << 20
MAX_VIEWER_EVENTS = 1000


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
