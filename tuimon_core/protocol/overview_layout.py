"""The overview's layout, in one place: its sections, how levels and percents are packed,
the two wire forms, and the typed reads the model and the views make of it.

The overview (docs/protocol.md, "Overview and findings") is what a heatmap cell, the
storage pane and the cluster rules read of a node, in a few hundred bytes. Its builder
is `tuimon_core/overview.py`, its check and the first form's upgrade are
`overview_checks.py` beside this file (the codec calls them); everything about where a
value lies in it is here, and nothing outside reads or writes its keys or offsets
directly: the builder writes by name (section_blob, FsRow and fs_row), readers read with
the functions below.

Form 2 (compact, what agents build): `gpu_levels` and `fabric_levels` are one bytes
object each, a metric count k then k runs of level bytes, and `fs_rows` lists rows of
FS_COLUMNS; `ports` is left out when it is the hello's. Form 1 (the first, what readers
that predate form 2 understand): `gpu` and `fabric` map metric to level bytes, `fs` is
a list of maps, `ports` always there. A reader asks for form 2 with
`subscribe.overview_form`; one that does not is sent form 1, so an agent or relay can
be upgraded before its viewers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from tuimon_core.protocol.fields import FS_COLUMNS, FS_ROW_FIELDS

# The newest overview form this code reads and writes.
OVERVIEW_FORM = 2

# The sections of form 2.
GPU_LEVELS = "gpu_levels"
FABRIC_LEVELS = "fabric_levels"
BUSY = "busy"
PORTS = "ports"
WAIT = "wait"
FS_ROWS = "fs_rows"
WHO = "who"  # who runs on the node: Slurm jobs, pods, users, training jobs
SECTIONS = frozenset({GPU_LEVELS, FABRIC_LEVELS, BUSY, PORTS, WAIT, FS_ROWS, WHO})
MAX_WHO = 32
MAX_WHO_LEN = 128

# Level blobs hold their metrics in these orders; a newer agent appends metrics, never
# reorders them, and a metric a reader lacks is "no data".
GPU_LEVEL_ORDER: tuple[str, ...] = ("util", "mem", "temp", "power", "clock", "health")
FABRIC_LEVEL_ORDER: tuple[str, ...] = ("util", "congestion", "errors")
# One bytes object a section, not a map of metric to bytes: at 4096 nodes a second,
# every object a viewer unpacks, checks and frees is counted in its CPU.
LEVEL_SECTIONS: dict[str, tuple[str, ...]] = {GPU_LEVELS: GPU_LEVEL_ORDER,
                                              FABRIC_LEVELS: FABRIC_LEVEL_ORDER}
# section -> metric -> its run's index: a dict lookup on the draw path (every node, each
# time a map line is keyed), where tuple.index compared metric objects field by field.
LEVEL_INDEX: dict[str, dict[str, int]] = {
    section: {key: i for i, key in enumerate(order)} for section, order in LEVEL_SECTIONS.items()}

# On the wire a level is one byte, level + LEVEL_OFFSET: 0 no data, 1 failed, 2..10 the
# nine steps. Bytes, not lists of ints: checked with one C call, and held by the viewer
# for 4096 nodes without thousands of containers for the garbage collector to walk.
LEVEL_OFFSET = 2
LEVEL_BYTES = bytes(range(LEVEL_OFFSET + 9))  # every valid level byte
# A GPU's busy: a whole percent 0..100, or this when it could not be read.
BUSY_UNKNOWN = 255
BUSY_BYTES = bytes([*range(101), BUSY_UNKNOWN])

_LEVEL = tuple(range(-LEVEL_OFFSET, 256 - LEVEL_OFFSET))


class FsRow(NamedTuple):
    """A shared file system of a node's overview (FS_COLUMNS, in order)."""

    id: str
    fstype: str | None
    read: float | None  # bytes/s
    write: float | None
    md_ops: float | None  # 1/s
    size: float | None  # bytes
    free: float | None


# -- writing ------------------------------------------------------------------------------


def level_byte(level: int) -> int:
    """A level (tuimon_core.heat_levels: 0..8, FAILED, NO_DATA) as its byte."""
    return level + LEVEL_OFFSET


def level_bytes(levels: list[int]) -> bytes:
    """A run of levels as their bytes (level_byte of each)."""
    return bytes([lv + LEVEL_OFFSET for lv in levels])


def level_blob(runs: list[bytes]) -> bytes:
    """A section's blob from its runs (one per metric, in the section's order)."""
    return bytes([len(runs)]) + b"".join(runs)


def section_blob(section: str, runs: dict[str, bytes]) -> bytes:
    """A level section's blob (GPU_LEVELS or FABRIC_LEVELS) from metric -> its run of
    level bytes: every metric of the section's order, in that order, as long as the
    longest run; a metric missing or short is no data (byte 0) in the cells it lacks."""
    cells = max(map(len, runs.values()), default=0)
    return level_blob([runs.get(key, b"")[:cells].ljust(cells, b"\0")
                       for key in LEVEL_SECTIONS[section]])


_ROW_TYPES = tuple(f.type for f in FS_ROW_FIELDS)


def fs_row(row: FsRow) -> list[Any]:
    """A shared file system as `fs_rows` holds it: FsRow's columns in order, each as the
    wire allows it (a mount path of escapes cut to its bound), so every reader's check
    passes what the agent sends."""
    return [None if v is None else t.fit(v) for t, v in zip(_ROW_TYPES, row)]


def busy_byte(busy: float | None) -> int:
    """How busy a GPU is (0..1, None unknown) as its byte: a whole percent."""
    return BUSY_UNKNOWN if busy is None else max(0, min(100, int(busy * 100 + 0.5)))


# -- reading ------------------------------------------------------------------------------


def level_run(blob: bytes, index: int) -> bytes | None:
    """The level bytes of the index-th metric of a (checked) blob; None if it lacks it."""
    k = blob[0]
    if index >= k:
        return None
    n = (len(blob) - 1) // k
    return blob[1 + index * n:1 + (index + 1) * n]


def levels_of(data: bytes) -> list[int]:
    """The levels of one metric's cells, from their bytes."""
    return list(map(_LEVEL.__getitem__, data))


def metric_levels(overview: dict[str, Any], section: str, metric: str) -> list[int] | None:
    """One metric's levels of a map (GPU_LEVELS or FABRIC_LEVELS), a level per cell;
    None when the overview has no such section or metric."""
    blob = overview.get(section)
    if not blob:
        return None
    run = level_run(blob, LEVEL_INDEX[section][metric])
    return None if run is None else levels_of(run)


def busy(overview: dict[str, Any]) -> bytes | None:
    """Each GPU's busy byte (a percent, BUSY_UNKNOWN where unknown), in inventory order."""
    return overview.get(BUSY)


def busy_percents(data: bytes) -> bytes:
    """The busy percents that were read (the unknown ones left out)."""
    return data.translate(None, bytes([BUSY_UNKNOWN]))


def port_waits(overview: dict[str, Any],
               hello_ports: list[str]) -> tuple[list[str], list[float]] | None:
    """(port ids, xmit_wait ticks/s) of the ports whose wait was read; None when there
    is none. The ids are the overview's own, or the hello's where it left them out."""
    waits = overview.get(WAIT)
    if not waits:
        return None
    ports = overview.get(PORTS) or hello_ports
    if None in waits or len(ports) != len(waits):
        pairs = [(p, w) for p, w in zip(ports, waits) if w is not None]
        if not pairs:
            return None
        return [p for p, _ in pairs], [w for _, w in pairs]
    return ports, waits


def fs_rows(overview: dict[str, Any]) -> Iterator[FsRow]:
    """The node's shared file systems, as rows."""
    for row in overview.get(FS_ROWS) or ():
        yield FsRow._make(row)


def who(overview: dict[str, Any]) -> list[str]:
    """Who runs on the node (what a filter matches besides its name)."""
    return overview.get(WHO) or []


# -- the first form -----------------------------------------------------------------------


# The first form's sections where form 2 has others: its level maps, its file systems.
FIRST_FORM_LEVELS: dict[str, str] = {"gpu": GPU_LEVELS, "fabric": FABRIC_LEVELS}
FIRST_FORM_FS = "fs"


def level_map(blob: bytes, order: tuple[str, ...]) -> dict[str, bytes]:
    """metric -> level bytes, for the metrics of `order` the blob holds (section_blob's
    inverse)."""
    return {key: run for i, key in enumerate(order)
            if (run := level_run(blob, i)) is not None}


def fs_map(row: list[Any]) -> dict[str, Any]:
    """A row of `fs_rows` as the first form's map of a file system."""
    return dict(zip(FS_COLUMNS, row))


def row_of_map(fs: dict[Any, Any]) -> list[Any]:
    """The first form's map of a file system as a row of `fs_rows` (fs_map's inverse;
    a column the map lacks is nil)."""
    return [fs.get(c) for c in FS_COLUMNS]


def first_form(overview: Any, port_ids: list[str]) -> Any:
    """A form-2 overview as form 1, for a reader that did not ask for form 2. `port_ids`
    are the hello's (what an overview without `ports` follows). A relay forwards
    overviews it has not checked, so what is not well formed is passed on as it is: the
    reader refuses it, as it would have from the agent."""
    if type(overview) is not dict:
        return overview
    out = dict(overview)
    try:
        for first, key in FIRST_FORM_LEVELS.items():
            blob = out.get(key)
            if type(blob) is bytes and blob and blob[0] and (len(blob) - 1) % blob[0] == 0:
                out[first] = level_map(out.pop(key), LEVEL_SECTIONS[key])
        rows = out.get(FS_ROWS)
        if type(rows) is list and all(type(r) is list for r in rows):
            out[FIRST_FORM_FS] = [fs_map(r) for r in out.pop(FS_ROWS)]
        if PORTS not in out and "fabric" in out:
            out[PORTS] = list(port_ids)
    except (TypeError, ValueError):
        return overview
    return out


def readable(overview: dict[str, Any], port_ids: list[str]) -> dict[str, Any]:
    """The overview in its first form (maps, named ports: `port_ids` are the hello's) with
    levels and percents as numbers (nil: unknown), for JSON and people
    (`tuimon-agent once --json`)."""
    out = first_form(overview, port_ids)
    for section in FIRST_FORM_LEVELS:
        if isinstance(out.get(section), dict):
            out[section] = {k: levels_of(v) for k, v in out[section].items()}
    if isinstance(out.get(BUSY), bytes):
        out[BUSY] = [None if b == BUSY_UNKNOWN else b for b in out[BUSY]]
    return out
