"""One node as the viewer knows it (`NodeState`: its hello, latest sample, overview,
state and history) and an event as the viewer lists it (`ClusterEvent`); the cluster
(tuimon/model/cluster.py) holds them."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tuimon_core.heat_levels import HeatMetric
from tuimon_core.node_states import CONNECTING, LOST, UNKNOWN
from tuimon_core.overview import sample_levels
from tuimon_core.protocol import Hello, Sample
from tuimon_core.protocol.overview_layout import BUSY_UNKNOWN, metric_levels
from tuimon_core.protocol.row_access import gpu_rows
from tuimon_core.protocol.rows import GpuRow

HISTORY = 300  # samples kept per GPU for sparklines: 5 minutes at 1 Hz


@dataclass(slots=True)
class ClusterEvent:
    """An event as the viewer lists it: which node, when, what."""

    node: str
    ts: float
    kind: str
    severity: str
    message: str
    gpu: int | None = None


@dataclass(slots=True)
class NodeState:
    target: str
    name: str
    hello: Hello | None = None
    sample: Sample | None = None
    status: str = CONNECTING  # one of STATES (tuimon_core.node_states)
    reason: str | None = None
    last_seen: float | None = None  # monotonic
    version: int = 0
    # The overviews' busy bytes (a percent per GPU), newest last: the node screen's
    # sparklines. One bytes object a sample, not a push per GPU: cheap at 4096 nodes.
    busy_hist: deque[bytes] = field(default_factory=lambda: deque(maxlen=HISTORY))
    xids: int = 0
    dropped: int = 0
    # Step sums of the samples since the efficiency view last read them (merged, so a
    # view that ticks slower than the agent samples misses no training time).
    pending_steps: dict[str, Any] | None = None
    # The relay target that speaks for this node; None when watched directly.
    owner: str | None = None
    # What the maps, panes and cluster rules read: the node's overview (the agent's, or
    # built here from a full sample of an agent that predates overviews).
    overview: dict[str, Any] | None = None
    # The latest sample with every value (the node screen's); None while the viewer takes
    # only this node's overview.
    detail: Sample | None = None
    # The conditions the node's own rules found in its latest sample (the `findings`
    # family); None when the agent does not judge itself and the viewer must.
    conditions: list[dict[str, Any]] | None = None
    # The hello's fabric ports: what an overview without `ports` of its own follows.
    port_ids: list[str] = field(default_factory=list)
    # The sample an overview built here was built from (an agent that predates
    # overviews, tuimon prom): its levels are computed from it when a map first reads
    # them, and kept until the next (levels). None where the agent sent its overview.
    levels_from: Sample | None = None
    _levels: dict[tuple[str, str], list[int] | None] = field(default_factory=dict)

    @property
    def lost(self) -> bool:
        """The viewer stopped hearing from this node (stale or down)."""
        return self.status in LOST

    @property
    def old_data(self) -> bool:
        """What the viewer holds of it is not now: lost, or behind an unreachable relay."""
        return self.status in LOST or self.status == UNKNOWN

    @property
    def gpu_count(self) -> int:
        return len(self.hello.gpus) if self.hello else 0

    def age(self, now: float | None = None) -> float | None:
        if self.last_seen is None:
            return None
        return (now if now is not None else time.monotonic()) - self.last_seen

    def busy_history(self, gpu: int) -> list[int]:
        """GPU `gpu`'s busy percents over the last HISTORY samples (unknown as 0)."""
        return [b[gpu] if gpu < len(b) and b[gpu] != BUSY_UNKNOWN else 0
                for b in self.busy_hist]

    def gpu_values(self) -> list[GpuRow]:
        return gpu_rows(self.detail)

    def levels(self, section: str, metric: HeatMetric) -> list[int] | None:
        """One metric's levels of one map's cells (GPU_LEVELS or FABRIC_LEVELS), a level
        per cell; None where the node has none. An agent's overview holds every
        metric's; for one built here only the metrics a map draws are computed, once a
        sample: the map draws one of nine, and computing all at every sample was a
        tenth of the viewer's time on tuimon prom (bench/prom.py)."""
        if self.levels_from is None:
            return None if self.overview is None else metric_levels(self.overview, section,
                                                                   metric.key)
        key = (section, metric.key)
        if key not in self._levels:
            self._levels[key] = sample_levels(self.hello, self.levels_from, section, metric)
        return self._levels[key]
