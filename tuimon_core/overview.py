"""A node's overview, built: the few values the cluster views need, made where the data is.

The overview is the `overview` family of a sample (docs/protocol.md): each GPU's and
each fabric port's heat level per metric, how busy each GPU is in percent, each port's
xmit_wait, and the node's shared file systems' throughput. It is what a heatmap cell,
the fabric and storage panes and the cluster rules read, in a few hundred bytes where
the full sample is ~10 KB. Its layout (sections, packing, reads) is
`tuimon_core/protocol/overview_layout.py`: this file writes every value by its name there
(a level section's metrics by key, a file system's row as an FsRow), never by position.

The agent builds it over every sample; a viewer or a relay builds the same thing from a
full sample of an agent that predates overviews, with the same function, so both paths
draw the same cells. Levels are already what the map shows (nine steps), and busy is a
whole percent, as the sparklines store it: quantising here loses nothing a screen shows.
"""

from __future__ import annotations

from typing import Any, cast

from tuimon_core.filesystems import SHARED_FSTYPES
from tuimon_core.heat_levels import FABRIC_METRICS, GPU_METRICS, HeatMetric, gpu_busy
from tuimon_core.protocol.fields import MAX_SHARED_FS
from tuimon_core.protocol.overview_layout import (
    BUSY,
    FABRIC_LEVELS,
    FS_ROWS,
    GPU_LEVELS,
    MAX_WHO,
    MAX_WHO_LEN,
    PORTS,
    WAIT,
    WHO,
    FsRow,
    busy_byte,
    fs_row,
    level_bytes,
    section_blob,
)
from tuimon_core.protocol.row_access import port_info_rows
from tuimon_core.protocol.rows import FsRow as FsValues
from tuimon_core.protocol.rows import GpuRow, PortInfoRow, PortRow

# The families a viewer of the whole cluster takes from every node; a node it looks at
# closely it takes whole (subscribe with no family filter).
OVERVIEW_FAMILIES: tuple[str, ...] = ("overview", "findings", "steps", "events")


def hello_port_ids(hello: Any) -> list[str]:
    """The ports an overview's `wait` and fabric levels follow where it has no `ports` of
    its own (the usual case: the agent leaves them out when they are the hello's)."""
    return [p["id"] for p in port_info_rows(hello)]


def has_overview(hello: Any) -> bool:
    """Does this agent send overviews and findings (newer than 0.x agents)?"""
    return hello is not None and "overview" in (hello.families or ())


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value + 0.5)


def _gpu_cells(hello: Any, gpus: list[GpuRow]) -> list[tuple[GpuRow, Any]]:
    """Each GPU's values with its static facts (the hello's, by index)."""
    infos = hello.gpus if hello is not None else []
    return [(g, infos[i] if i < len(infos) else None) for i, g in enumerate(gpus)]


def _port_cells(hello: Any, ports: list[PortRow]) -> list[tuple[PortRow, PortInfoRow | None]]:
    """Each port's values with its static facts (the hello's, by id)."""
    known = {p["id"]: p for p in port_info_rows(hello)}
    return [(p, known.get(p["id"])) for p in ports]


def sample_levels(hello: Any, sample: Any, section: str, metric: HeatMetric) -> list[int] | None:
    """One metric's levels of one map's cells (GPU_LEVELS or FABRIC_LEVELS) from a full
    sample, as build_overview packs them for every metric; None where the sample lacks
    that map's section."""
    if section == GPU_LEVELS:
        gpus = cast("list[GpuRow] | None", sample.gpus)
        return None if gpus is None else metric.levels(_gpu_cells(hello, gpus))
    fabric = sample.extra.get("fabric")
    return None if fabric is None else metric.levels(
        _port_cells(hello, cast("list[PortRow]", fabric.get("ports") or [])))


def build_overview(hello: Any, sample: Any, levels: bool = True) -> dict[str, Any]:
    """The overview of one full sample (`hello` gives the static facts the levels are
    relative to: a GPU's maximum clock, a port's rate). Sections the sample lacks (the
    GPU collector failed, no fabric family) are absent, not empty. Without `levels`, no
    metric's levels: for a reader that holds the sample and computes the levels of the
    metric it draws as it draws them (sample_levels)."""
    out: dict[str, Any] = {}
    gpus = cast("list[GpuRow] | None", sample.gpus)
    if gpus is not None:
        if levels:
            pairs = _gpu_cells(hello, gpus)
            out[GPU_LEVELS] = section_blob(GPU_LEVELS, {m.key: level_bytes(m.levels(pairs))
                                                        for m in GPU_METRICS})
        out[BUSY] = bytes(busy_byte(gpu_busy(g)[0]) for g in gpus)
    extra = sample.extra
    fabric = extra.get("fabric")
    if fabric is not None:
        ports = cast("list[PortRow]", fabric.get("ports") or [])
        ids = [p["id"] for p in ports]
        if ids != hello_port_ids(hello):  # usually they are: the hello's, in its order
            out[PORTS] = ids
        if levels:
            cells = _port_cells(hello, ports)
            out[FABRIC_LEVELS] = section_blob(FABRIC_LEVELS, {m.key: level_bytes(m.levels(cells))
                                                              for m in FABRIC_METRICS})
        out[WAIT] = [_whole(p.get("xmit_wait_s")) for p in ports]
    storage = extra.get("storage")
    if storage is not None:
        filesystems = cast("list[FsValues]", storage.get("filesystems") or [])
        rows = [
            FsRow(id=f["id"], fstype=f.get("fstype"), read=_whole(f.get("read_bytes_s")),
                  write=_whole(f.get("write_bytes_s")), md_ops=f.get("metadata_ops_s"),
                  size=f.get("size"), free=f.get("free"))
            for f in filesystems if f.get("fstype") in SHARED_FSTYPES]
        out[FS_ROWS] = [fs_row(r) for r in rows[:MAX_SHARED_FS]]
    names = _who(gpus or [], extra.get("steps"))
    if names:
        out[WHO] = names
    return out


def _who(gpus: list[GpuRow], steps: Any) -> list[str]:
    """Who runs on the node, as people search for it: the GPU processes' Slurm jobs,
    pods (namespace/name) and users, then the training jobs reporting steps; each once,
    at most MAX_WHO of them."""
    seen: dict[str, None] = {}
    for g in gpus:
        procs, mig = g.get("processes"), g.get("mig")
        if not (procs or mig):
            continue  # an idle GPU, or a source that sees no process (Prometheus)
        for p in [*(procs or ()), *(p for m in mig or () for p in m.get("processes") or ())]:
            pod = f"{p['namespace']}/{p['pod']}" if p.get("namespace") and p.get("pod") \
                else p.get("pod")
            for value in (p.get("job"), pod, p.get("user")):
                if value:
                    seen[str(value)[:MAX_WHO_LEN]] = None
    for job in (steps or {}).get("jobs") or ():
        seen[str(job["id"])[:MAX_WHO_LEN]] = None
    return list(seen)[:MAX_WHO]
