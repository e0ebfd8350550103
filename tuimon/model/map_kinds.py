"""What a heatmap cell shows: the map kinds (GPUs, fabric ports), how a node's cells are
read from its overview, and the glyphs of the scale.

The levels themselves are computed in tuimon_core.heat_levels, where the agent computes
them too; views only map levels to colours and glyphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuimon_core.heat_levels import (
    BUSY_FIELDS,
    FABRIC_METRICS,
    FAILED,
    GPU_METRICS,
    LEVELS,
    NO_DATA,
    WORST_WINS,
    HeatMetric,
    fold,
    gpu_busy,
    gpu_health,
)
from tuimon_core.protocol.overview_layout import FABRIC_LEVELS, GPU_LEVELS

__all__ = ["BUSY_FIELDS", "FABRIC_MAP", "FABRIC_METRICS", "FAILED", "GLYPHS", "GPU_MAP",
           "GPU_METRICS", "LEVELS", "NO_DATA", "WORST_WINS", "HeatMetric", "MapKind", "fold",
           "gpu_busy", "gpu_health", "gpus_missing", "node_level"]

# Cell glyphs by level, so the scale reads without colour (NO_COLOR, 16-colour terminals).
GLYPHS = (" ", "\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588")


def node_level(metric: HeatMetric, gpus: list[dict[str, Any]], infos: list[Any]) -> int:
    """A node's GPUs folded to one cell."""
    if not gpus:
        return NO_DATA
    return fold(metric, metric.levels((g, infos[i] if i < len(infos) else None)
                                      for i, g in enumerate(gpus)))


@dataclass(frozen=True, slots=True)
class MapKind:
    """A heatmap's kind: what its cells are (a node's GPUs, or its fabric ports), the
    metrics they can show, and how a node folds to one cell. Cells are read from the
    node (NodeState.levels: its agent's overview, or computed here from its sample by
    the same rules). The map widget and the sort ask the kind; neither switches on
    which kind it is."""

    key: str  # "gpu" | "fabric"
    title: str
    metrics: tuple[HeatMetric, ...]
    grouped: bool = False  # laid out under its leaf switches when the topology is known
    section: str = GPU_LEVELS  # the overview's blob of this map's levels

    def cell_count(self, node: Any, cpu_nodes: frozenset[str] = frozenset()) -> int:
        raise NotImplementedError

    def levels(self, node: Any, metric: HeatMetric,
               cpu_nodes: frozenset[str] = frozenset()) -> list[int]:
        """Each cell's level, in order."""
        levels = node.levels(self.section, metric)
        return [NO_DATA] * self.cell_count(node, cpu_nodes) if levels is None else levels

    def node_level(self, node: Any, metric: HeatMetric,
                   cpu_nodes: frozenset[str] = frozenset()) -> int:
        """The node as one cell: what a folded map draws and what sorting by metric uses."""
        return fold(metric, self.levels(node, metric, cpu_nodes))


@dataclass(frozen=True, slots=True)
class GpuMapKind(MapKind):
    def cell_count(self, node: Any, cpu_nodes: frozenset[str] = frozenset()) -> int:
        return node.gpu_count or (1 if gpus_missing(node, cpu_nodes) else 0)

    def levels(self, node: Any, metric: HeatMetric,
               cpu_nodes: frozenset[str] = frozenset()) -> list[int]:
        if gpus_missing(node, cpu_nodes):
            return [FAILED]
        return MapKind.levels(self, node, metric, cpu_nodes)


@dataclass(frozen=True, slots=True)
class FabricMapKind(MapKind):
    def cell_count(self, node: Any, cpu_nodes: frozenset[str] = frozenset()) -> int:
        return len(node.hello.extra.get("ports") or ()) if node.hello else 0


def gpus_missing(node: Any, cpu_nodes: frozenset[str] = frozenset()) -> bool:
    """The agent sees no GPU and says why, on a node not known to be GPU-less: one failed
    cell, so its tile is not blank and it sorts with the failed."""
    h = node.hello
    return h is not None and not h.gpus and bool(h.gpu_status) and node.name not in cpu_nodes


GPU_MAP: MapKind = GpuMapKind("gpu", "GPUs", GPU_METRICS)
FABRIC_MAP: MapKind = FabricMapKind("fabric", "fabric", FABRIC_METRICS, grouped=True,
                                    section=FABRIC_LEVELS)
