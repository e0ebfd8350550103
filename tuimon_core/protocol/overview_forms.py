"""The overview's two wire forms, and the one a reader asks for.

Form 2 (compact, what agents build): `gpu_levels` and `fabric_levels` are one bytes
object each, a metric count k then k runs of level bytes, and `fs_rows` lists rows of
FS_COLUMNS; `ports` is left out when it is the hello's. Form 1 (the first, what readers
that predate form 2 understand): `gpu` and `fabric` map metric to level bytes, `fs` is
a list of maps, `ports` always there. A reader asks for form 2 with
`subscribe.overview_form`; one that does not is sent form 1, so an agent or relay can
be upgraded before its viewers (docs/protocol.md, "Overview and findings").
"""

from __future__ import annotations

from typing import Any

from tuimon_core.protocol.fields import FABRIC_LEVEL_ORDER, FS_COLUMNS, GPU_LEVEL_ORDER

# The newest overview form this code reads and writes.
OVERVIEW_FORM = 2

# One bytes object a section, not a map of metric to bytes: at 4096 nodes a second,
# every object a viewer unpacks, checks and frees is counted in its CPU. A newer agent's
# extra metrics come after these; one a reader lacks is "no data".
LEVEL_SECTIONS: dict[str, tuple[str, ...]] = {"gpu_levels": GPU_LEVEL_ORDER,
                                              "fabric_levels": FABRIC_LEVEL_ORDER}
# section -> metric -> its run's index: a dict lookup on the draw path (every node, each
# time a map line is keyed), where tuple.index compared metric objects field by field.
LEVEL_INDEX: dict[str, dict[str, int]] = {
    section: {key: i for i, key in enumerate(order)} for section, order in LEVEL_SECTIONS.items()}


def level_blob(runs: list[bytes]) -> bytes:
    """A section's blob from its runs (one per metric, in the section's order)."""
    return bytes([len(runs)]) + b"".join(runs)


def level_run(blob: bytes, index: int) -> bytes | None:
    """The level bytes of the index-th metric of a (checked) blob; None if it lacks it."""
    k = blob[0]
    if index >= k:
        return None
    n = (len(blob) - 1) // k
    return blob[1 + index * n:1 + (index + 1) * n]


def level_map(blob: bytes, order: tuple[str, ...]) -> dict[str, bytes]:
    """metric -> level bytes, for the metrics of `order` the blob holds."""
    return {key: run for i, key in enumerate(order)
            if (run := level_run(blob, i)) is not None}


def first_form(overview: Any, port_ids: list[str]) -> Any:
    """A form-2 overview as form 1, for a reader that did not ask for form 2. `port_ids`
    are the hello's (what an overview without `ports` follows). A relay forwards
    overviews it has not checked, so what is not well formed is passed on as it is: the
    reader refuses it, as it would have from the agent."""
    if type(overview) is not dict:
        return overview
    out = dict(overview)
    try:
        for key, order in LEVEL_SECTIONS.items():
            blob = out.get(key)
            if type(blob) is bytes and blob and blob[0] and (len(blob) - 1) % blob[0] == 0:
                out[key.removesuffix("_levels")] = level_map(out.pop(key), order)
        rows = out.get("fs_rows")
        if type(rows) is list and all(type(r) is list for r in rows):
            out["fs"] = [dict(zip(FS_COLUMNS, r)) for r in out.pop("fs_rows")]
        if "ports" not in out and "fabric" in out:
            out["ports"] = list(port_ids)
    except (TypeError, ValueError):
        return overview
    return out
