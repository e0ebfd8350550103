"""Heat levels: a metric's value on a cell (a GPU, a fabric port) as one of nine steps.

Plain functions over the wire's values, shared by the agent (which sends a node's
levels in its overview, docs/protocol.md) and the viewer (which computes them itself
for agents that predate overviews, and folds a node to one cell). A level is an int:
0..8, or FAILED, or NO_DATA.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tuimon_core.gpu_state import BUSY_FIELDS, gpu_busy, throttle
from tuimon_core.protocol.fields import port_down
from tuimon_core.protocol.rows import GpuRow, PortRow

LEVELS = 9  # heat-0 .. heat-8 in the themes
FAILED = -1  # the GPU or port failed: drawn as a red cross whatever the metric
NO_DATA = -2
_TOP = LEVELS - 1.0
_TOP_LEVEL = LEVELS - 1

# A cell's values: a GPU's row (GpuRow) or a fabric port's (PortRow).
Row = TypeVar("Row", bound=Mapping[str, object])


@dataclass(frozen=True, slots=True)
class HeatMetric(Generic[Row]):
    key: str
    label: str
    legend: tuple[str, str]  # what the low and high ends mean
    value: Callable[[Row, Any], float | None]  # 0..1, or None when unknown
    # The sample's fields `value` reads (besides `failed`, which every level reads): what
    # a source that asks only for what the maps draw must ask to draw this metric
    # (tuimon prom, ClusterState.drawn).
    reads: frozenset[str] = frozenset()
    # A field without which the value is unknown: a cell without it is NO_DATA, `value`
    # not called (a source that asks only what is drawn leaves most maps' fields out).
    needs: str | None = None

    def level(self, values: Row, info: Any = None) -> int:
        return self.levels(((values, info),))[0]

    def levels(self, cells: Iterable[tuple[Row, Any]]) -> list[int]:
        """The levels of many cells, each (its values, its static facts): one loop, as
        an overview takes a node's GPUs or ports at once."""
        value, needs = self.value, self.needs
        out = []
        for values, info in cells:
            if values.get("failed"):
                out.append(FAILED)
                continue
            if needs is not None and needs not in values:
                out.append(NO_DATA)
                continue
            v = value(values, info)
            if v is None or v != v:  # NaN: nothing known
                out.append(NO_DATA)
                continue
            # Clamped before the int: a ratio of valid values can be inf (a power limit
            # of 1e-309), and the level of anything past the top is the top.
            x = v * _TOP + 0.5
            out.append(_TOP_LEVEL if x >= _TOP else (int(x) if x > 0.0 else 0))
        return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return a / b


_HEALTH_READS = frozenset({"remap_failed", "ecc_uncorrected", "last_xid", "clock_events",
                           "remap_pending", "retired_pending", "temp",
                           *(key for key, _ in BUSY_FIELDS)})


def gpu_health(v: GpuRow, info: Any = None) -> float | None:
    """0 healthy, 0.5 degraded (throttling, corrected ECC growth, pending remap), 1 bad."""
    if v.get("remap_failed") or (v.get("ecc_uncorrected") or 0) > 0 or v.get("last_xid"):
        return 1.0
    found = throttle(v, info) if v.get("clock_events") else None
    if found is not None and found.severity == "critical":
        return 1.0
    if found is not None or v.get("remap_pending") or v.get("retired_pending"):
        return 0.5
    if gpu_busy(v)[0] is None and v.get("temp") is None:
        return None
    return 0.0


GPU_METRICS: tuple[HeatMetric[GpuRow], ...] = (
    HeatMetric("util", "GPU busy (SM active, else utilization)",
               ("0 %", "100 %"), lambda v, i: gpu_busy(v)[0],
               frozenset(key for key, _ in BUSY_FIELDS)),
    HeatMetric("mem", "memory used", ("0 %", "100 %"),
               lambda v, i: _ratio(v.get("mem_used"), v.get("mem_total")),
               frozenset({"mem_used", "mem_total"}), needs="mem_used"),
    HeatMetric("temp", "temperature", ("30 °C", "90 °C"),
               lambda v, i: None if (t := v.get("temp")) is None
               else min(1.0, max(0.0, (t - 30) / 60)), frozenset({"temp"}),
               needs="temp"),
    HeatMetric("power", "power vs limit", ("0 %", "100 %"),
               lambda v, i: _ratio(v.get("power"), v.get("power_limit")),
               frozenset({"power", "power_limit"}), needs="power"),
    HeatMetric("clock", "SM clock vs max", ("0 %", "100 %"),
               lambda v, i: _ratio(v.get("sm_clock"), getattr(i, "max_sm_clock", None)),
               frozenset({"sm_clock"}), needs="sm_clock"),
    HeatMetric("health", "health", ("ok", "XID / ECC / failed"), gpu_health, _HEALTH_READS),
)


def _port_util(v: PortRow, info: Any = None) -> float | None:
    tx, rx = v.get("tx_util"), v.get("rx_util")
    if tx is None and rx is None:
        return None
    return max(tx or 0.0, rx or 0.0)


def _congestion(v: PortRow, info: Any = None) -> float | None:
    """InfiniBand: xmit_wait ticks/s on a log scale, 1e2 quiet .. 1e6 starved of credits.
    RoCE (no xmit_wait): the share of time the peer held the port off with PFC pauses,
    half the time or more at the top."""
    wait = v.get("xmit_wait_s")
    if wait is None:
        paused = v.get("paused_rx")
        return None if paused is None else min(1.0, max(0.0, 2.0 * paused))
    return min(1.0, max(0.0, (math.log10(wait + 1) - 2) / 4))


def _port_errors(v: PortRow, info: Any = None) -> float | None:
    if port_down(v.get("state"), v.get("phys_state")):
        return 1.0  # the link carries nothing
    inc = v.get("errors_inc") or {}
    bad = sum(n for n in inc.values() if n)
    if inc.get("link_downed"):
        return 1.0
    if bad:
        return min(1.0, 0.4 + 0.1 * math.log10(bad + 1))
    if v.get("saturated"):
        return 0.3
    return 0.0


FABRIC_METRICS: tuple[HeatMetric[PortRow], ...] = (
    HeatMetric("util", "link utilization", ("0 %", "100 %"), _port_util,
               frozenset({"tx_util", "rx_util"})),
    HeatMetric("congestion", "congestion (xmit_wait; RoCE: time paused)", ("quiet", "starved"),
               _congestion, frozenset({"xmit_wait_s", "paused_rx"})),
    HeatMetric("errors", "link errors", ("none", "link down"), _port_errors,
               frozenset({"state", "phys_state", "errors_inc", "saturated"})),
)


# Metrics where the worst cell speaks for a folded node; the rest fold to their mean.
WORST_WINS = frozenset({"health", "temp", "errors", "congestion"})


def fold(metric: HeatMetric, levels: list[int]) -> int:
    """One cell for a whole node (the folded map, sorting by metric): failed wins, else
    the worst cell for health, temperature, errors and congestion, the mean for the
    rest; nothing known is NO_DATA."""
    if FAILED in levels:
        return FAILED
    known = [lv for lv in levels if lv >= 0]
    if not known:
        return NO_DATA
    if metric.key in WORST_WINS:
        return max(known)
    return round(sum(known) / len(known))
