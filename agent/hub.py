"""Fan-out of frames to stream clients, each with a bounded queue.

A frame is encoded once per distinct family filter and shared by every client that
wants the same bytes. A client that reads too slowly loses its oldest frames (counted,
and the count is sent to it in its next sample), so no client can grow the agent's
memory.
"""

from __future__ import annotations

import asyncio
from collections import deque

from tuimon_core.protocol.families import Frame, wants_events
from tuimon_core.protocol.messages import Event, Hello, Sample


class StreamClient:
    """One connected viewer: its queue, its subscription and its drop count."""

    def __init__(self, peer: str, max_frames: int, agent_interval: float) -> None:
        self.peer = peer
        self.queue: deque[Frame] = deque()
        self.max_frames = max_frames
        self.dropped = 0
        self.reported_dropped = 0
        self.wake = asyncio.Event()
        self.families: frozenset[str] | None = None
        # The overview form it reads: the first until it says otherwise (a viewer that
        # predates form 2 never does).
        self.form = 1
        self.every = 1
        self._agent_interval = agent_interval

    def subscribe(self, interval: float | None, families: list[str] | None,
                  overview_form: int | None = None) -> None:
        if interval is not None:
            self.every = max(1, round(interval / self._agent_interval))
        else:
            self.every = 1
        self.families = frozenset(families) if families is not None else None
        self.form = overview_form or 1

    def wants_events(self) -> bool:
        return wants_events(self.families)

    def offer(self, frame: Frame) -> None:
        if len(self.queue) >= self.max_frames:
            # Drop the oldest frame that is not a hello: without its hello a viewer
            # cannot read the samples that follow.
            for i, queued in enumerate(self.queue):
                if not isinstance(queued.message, Hello):
                    del self.queue[i]
                    break
            else:
                self.queue.popleft()
            self.dropped += 1
        self.queue.append(frame)
        self.wake.set()

    def next_bytes(self) -> bytes | None:
        """Pop the next frame's bytes, carrying the drop count if it has grown."""
        if not self.queue:
            self.wake.clear()
            return None
        frame = self.queue.popleft()
        dropped = 0
        if self.dropped != self.reported_dropped and isinstance(frame.message, Sample):
            dropped = self.reported_dropped = self.dropped
        return frame.encoded(self.families, dropped, self.form)


class FrameHub:
    """The set of stream clients of one agent."""

    def __init__(self, max_clients: int = 256, max_frames: int = 32) -> None:
        self.max_clients = max_clients
        self.max_frames = max_frames
        self.clients: set[StreamClient] = set()
        self.dropped_total = 0

    def connect(self, peer: str, agent_interval: float) -> StreamClient | None:
        if len(self.clients) >= self.max_clients:
            return None
        client = StreamClient(peer, self.max_frames, agent_interval)
        self.clients.add(client)
        return client

    def disconnect(self, client: StreamClient) -> None:
        self.clients.discard(client)

    def takes(self, seq: int) -> bool:
        """Does any client take the sample numbered `seq` (a slowed one takes every
        `every`-th)? What only a stream reads is built for no other."""
        return any(seq % c.every == 0 for c in self.clients)

    def publish_sample(self, sample: Sample, port_ids: list[str] | None = None,
                       data: bytes = b"") -> None:
        """`port_ids`: the hello's ports, which a first-form overview names; `data`: the
        sample's encoding with every family, when the caller has made it already."""
        frame = Frame(sample, data, port_ids=port_ids)
        for c in self.clients:
            if sample.seq % c.every == 0:
                before = c.dropped
                c.offer(frame)
                self.dropped_total += c.dropped - before

    def publish(self, message: Hello | Event) -> None:
        frame = Frame(message)
        for c in self.clients:
            if isinstance(message, Event) and not c.wants_events():
                continue
            before = c.dropped
            c.offer(frame)
            self.dropped_total += c.dropped - before
