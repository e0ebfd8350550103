"""The ports' error counters across refreshes: what each grew by since its last reading
(the wire's `errors_inc`), and which ports the last reading found, that stand for the
node's ports until the next (the counters are read every `errors_every`, not every
refresh)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tuimon.sources.prom_values import whole
from tuimon_core.protocol.fields import PORT_HEALTHY

if TYPE_CHECKING:
    from tuimon.sources.prom_assembly import Node

# A port's error counters while its node is assembled, by exporter.
_ERRORS_OURS = "_errors_tuimon"
_ERRORS_NODE = "_errors_node_exporter"
_READ = "_read"  # among a port's counters: they were read (its state answered), its state

# How long a node absent from the answers keeps its ports' error counters as last read.
PORT_ERRORS_KEPT_S = 600.0


def _state_read(port: dict[str, Any]) -> float | None:
    """A port's state as the last read of its counters found it (our agent's first, as
    everywhere: both exporters on one node); None where they were not read."""
    for key in (_ERRORS_OURS, _ERRORS_NODE):
        state = port.get(key, {}).get(_READ)
        if state is not None:
            return state
    return None


class PortReadings:
    """Each port's counters as last read, by node; `clock` arguments are monotonic
    seconds."""

    def __init__(self, errors_every: float | None) -> None:
        self.errors_every = errors_every
        # node -> (when, port -> its error counters as last read: (from our agent,
        # kind -> total))
        self._errors: dict[str, tuple[float, dict[str, tuple[bool, dict[str, float]]]]] = {}
        # node -> port -> its state, at the last read of the error counters, and when
        self.read: dict[str, dict[str, float]] = {}
        self.read_at = -math.inf

    @staticmethod
    def unreadable(port: dict[str, Any], kind: str) -> None:
        """Our agent could not read this counter: NaN, not known, where no other series
        says."""
        port.setdefault(_ERRORS_OURS, {}).setdefault(kind, math.nan)

    @staticmethod
    def counter(port: dict[str, Any], ours: bool, kind: str | None, value: float) -> None:
        """One series of a port's counters: `kind`'s total, or (None) its state, which
        says its counters were read."""
        counters = port.setdefault(_ERRORS_OURS if ours else _ERRORS_NODE, {})
        if kind is None:
            counters[_READ] = value
        else:  # two series of one counter (two jobs scrape it): the higher
            counters[kind] = max(value, counters.get(kind, value))

    def keep_read(self, nodes: dict[str, Node], read: bool, clock: float) -> None:
        """The ports whose state answered at the last read of the error counters stand
        for the node's ports until the next (every 15 s): between two reads, a port with
        no other series asked (no xmit_wait, its traffic not drawn) is still there."""
        if read:
            self.read_at = clock
            self.read = {name: {pid: state for pid, p in n.ports.items()
                                 if (state := _state_read(p)) is not None}
                          for name, n in nodes.items()}
        for name, n in nodes.items():
            for pid in self.read.get(name, {}):
                if pid not in n.ports:
                    n.ports[pid] = {"id": pid}

    def fill_active(self, nodes: dict[str, Node], clock: float) -> None:
        """A port the last read of the counters found ACTIVE, that the live query of the
        states other than ACTIVE does not name now, is ACTIVE (the node screen says so,
        not "-"). One that read found otherwise stays unknown (the live query may have
        no answer of its own: a record whose rule fails), and so does every port where
        that read is older than two of its intervals (the counters' query failing).
        After the machines named twice are merged, so that one name's live state is not
        lost to the other's ACTIVE."""
        every = self.errors_every
        if every is None or clock - self.read_at > 2 * every:
            return
        active = float(PORT_HEALTHY["state"])
        for name, n in nodes.items():
            for pid, state in self.read.get(name, {}).items():
                port = n.ports.get(pid)
                if port is not None and state == active:
                    port.setdefault("state", active)

    def count(self, nodes: dict[str, Node], clock: float) -> None:
        """Each port's error counts since the last refresh, by kind (the wire's
        `errors_inc`), from its counters now and at the last reading. A port's counters
        are read when its exporter's last scrape is in the answer (its state answered:
        prom_queries.PORT_READ_SERIES); then a counter absent from it is 0, unless its
        exporter says it could not read it (our agent's PORT_UNREADABLE_METRIC): that
        one is as last read, and one not read since it could not be counts from when it
        is. Not read (a failed scrape, a target being replaced), they are as last read,
        and what they grew by meanwhile is counted when they are read again. A port
        first read, or read from the other exporter than last time, counts from now (its
        counters' past is not news); a counter that went down was reset (a reboot, a
        driver reload) and counts from there."""
        before = self._errors
        # A node absent from this refresh keeps its readings a while (its scrapes failing
        # for minutes, or its name not resolved this once): read again, it counts on.
        now = {name: entry for name, entry in before.items()
               if name not in nodes and clock - entry[0] < PORT_ERRORS_KEPT_S}
        for name, n in nodes.items():
            last = before.get(name, (clock, {}))[1]
            kept = dict(last)  # its ports absent this refresh: as last read
            now[name] = (clock, kept)
            for pid, p in n.ports.items():
                ours, theirs = p.pop(_ERRORS_OURS, None), p.pop(_ERRORS_NODE, None)
                was = last.get(pid)
                if ours is not None and _READ in ours:
                    read = (True, ours)  # both exporters on one node: ours, as elsewhere
                elif theirs is not None and _READ in theirs:
                    read = (False, theirs)
                else:
                    continue  # not read: as last read
                kept[pid] = read
                if was is None or was[0] != read[0]:
                    continue
                then, counters = was[1], read[1]
                grew = {}
                for kind, value in counters.items():
                    if kind == _READ:
                        continue
                    known = then.get(kind, 0.0)
                    if value != value:  # its exporter could not read it: as last read
                        counters[kind] = known
                        continue
                    # None where it went down (a reset), is past a count, or was not read
                    # last time (NaN): it counts from now.
                    count = whole(value - known)
                    if count:
                        grew[kind] = count
                if grew:
                    p["errors_inc"] = grew
        self._errors = now
