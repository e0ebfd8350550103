"""A node's overview: the few values the cluster views need, made where the data is.

The overview is the `overview` family of a sample (docs/protocol.md): each GPU's and
each fabric port's heat level per metric, how busy each GPU is in percent, each port's
xmit_wait, and the node's shared file systems' throughput. It is what a heatmap cell,
the fabric and storage panes and the cluster rules read, in a few hundred bytes where
the full sample is ~10 KB. The node's rule conditions travel beside it as the
`findings` family.

The agent builds it over every sample; a viewer or a relay builds the same thing from a
full sample of an agent that predates overviews, with the same function, so both paths
draw the same cells. Levels are already what the map shows (nine steps), and busy is a
whole percent, as the sparklines store it: quantising here loses nothing a screen shows.
"""

from __future__ import annotations

from typing import Any

from tuimon_core.findings import Finding
from tuimon_core.heat_levels import FABRIC_METRICS, GPU_METRICS, gpu_busy
from tuimon_core.protocol.fields import FAMILY_TYPES, FS_ROW_FIELDS, MAX_SHARED_FS
from tuimon_core.protocol.overview_forms import first_form, level_blob

# The families a viewer of the whole cluster takes from every node; a node it looks at
# closely it takes whole (subscribe with no family filter).
OVERVIEW_FAMILIES: tuple[str, ...] = ("overview", "findings", "steps", "events")

# File systems several nodes share: summed across the cluster in the storage pane.
SHARED_FSTYPES = frozenset({"lustre", "gpfs", "nfs", "nfs4", "beegfs", "wekafs", "fuse.weka",
                            "ceph", "cephfs", "panfs"})


# On the wire a level is one byte, level + LEVEL_OFFSET: 0 no data, 1 failed, 2..10 the
# nine steps. Bytes, not lists of ints: checked with one C call, and held by the viewer
# for 4096 nodes without thousands of containers for the garbage collector to walk.
LEVEL_OFFSET = 2
MAX_LEVEL_BYTE = 10
BUSY_UNKNOWN = 255  # a GPU whose busy could not be read


def levels_of(data: bytes) -> list[int]:
    """The levels of one metric's cells, from the overview's bytes."""
    return list(map(_LEVEL.__getitem__, data))


_LEVEL = tuple(range(-LEVEL_OFFSET, 256 - LEVEL_OFFSET))

def hello_port_ids(hello: Any) -> list[str]:
    """The ports an overview's `wait` and fabric levels follow where it has no `ports` of
    its own (the usual case: the agent leaves them out when they are the hello's)."""
    if hello is None:
        return []
    return [p["id"] for p in hello.extra.get("ports") or ()]


def busy_values(data: bytes) -> bytes:
    """The busy percents that were read (the unknown ones left out)."""
    return data.translate(None, bytes([BUSY_UNKNOWN]))


def readable(overview: dict[str, Any], port_ids: list[str]) -> dict[str, Any]:
    """The overview in its first form (maps, named ports: `port_ids` are the hello's) with
    levels and percents as numbers (nil: unknown), for JSON and people
    (`tuimon-agent once --json`)."""
    out = first_form(overview, port_ids)
    for section in ("gpu", "fabric"):
        if isinstance(out.get(section), dict):
            out[section] = {k: levels_of(v) for k, v in out[section].items()}
    if isinstance(out.get("busy"), bytes):
        out["busy"] = [None if b == BUSY_UNKNOWN else b for b in out["busy"]]
    return out


def _whole(value: Any) -> int | None:
    return None if value is None else int(value + 0.5)


def build_overview(hello: Any, sample: Any) -> dict[str, Any]:
    """The overview of one full sample (`hello` gives the static facts the levels are
    relative to: a GPU's maximum clock, a port's rate). Sections the sample lacks (the
    GPU collector failed, no fabric family) are absent, not empty."""
    out: dict[str, Any] = {}
    gpus = sample.gpus
    if gpus is not None:
        infos = hello.gpus if hello is not None else []
        pairs = [(g, infos[i] if i < len(infos) else None) for i, g in enumerate(gpus)]
        out["gpu_levels"] = level_blob(
            [bytes([m.level(g, info) + LEVEL_OFFSET for g, info in pairs])
             for m in GPU_METRICS])
        busy = bytearray()
        for g in gpus:
            b = gpu_busy(g)[0]
            busy.append(BUSY_UNKNOWN if b is None else max(0, min(100, int(b * 100 + 0.5))))
        out["busy"] = bytes(busy)
    extra = sample.extra
    fabric = extra.get("fabric")
    if fabric is not None:
        ports = fabric.get("ports") or []
        known = {p["id"]: p for p in hello.extra.get("ports") or ()} if hello is not None else {}
        pairs = [(p, known.get(p["id"])) for p in ports]
        ids = [p["id"] for p in ports]
        if ids != hello_port_ids(hello):  # usually they are: the hello's, in its order
            out["ports"] = ids
        out["fabric_levels"] = level_blob(
            [bytes([m.level(p, info) + LEVEL_OFFSET for p, info in pairs])
             for m in FABRIC_METRICS])
        out["wait"] = [_whole(p.get("xmit_wait_s")) for p in ports]
    storage = extra.get("storage")
    if storage is not None:
        rows = [
            [f["id"], f.get("fstype"), _whole(f.get("read_bytes_s")),
             _whole(f.get("write_bytes_s")), f.get("metadata_ops_s"), f.get("size"),
             f.get("free")]
            for f in storage.get("filesystems") or [] if f.get("fstype") in SHARED_FSTYPES]
        out["fs_rows"] = [_fit_row(r) for r in rows[:MAX_SHARED_FS]]
    return out


_ROW_TYPES = tuple(f.type for f in FS_ROW_FIELDS)


def _fit_row(row: list[Any]) -> list[Any]:
    """A row as the wire allows it (a mount path of escapes cut to its bound): every
    reader's check passes what the agent sends."""
    return [None if v is None else t.fit(v) for t, v in zip(_ROW_TYPES, row)]


def findings_to_wire(conditions: list[Finding]) -> list[dict[str, Any]]:
    """A node's rule conditions as the `findings` family: what holds now. The reader's
    own FindingBook adds the hold and the hysteresis, exactly as for conditions it
    judged itself. The node is not sent: a reader names the node that sent it."""
    out = []
    for f in conditions:
        row: dict[str, Any] = {"severity": f.severity, "kind": f.kind, "message": f.message}
        if f.gpu is not None:
            row["gpu"] = f.gpu
        if f.port is not None:
            row["port"] = f.port
        if f.fs is not None:
            row["fs"] = f.fs
        if f.score:
            row["score"] = f.score
        out.append(row)
    return _FINDINGS.fit(out)  # at most MAX_FINDINGS, each string within its bound


_FINDINGS = FAMILY_TYPES["findings"]


def findings_from_wire(rows: list[dict[str, Any]], node: str,
                       target: str | None = None) -> list[Finding]:
    """The conditions a node sent (already checked by the decoder), named after the node
    the reader knows it as: a node cannot raise findings about another. `target`: the
    address they came from, where the reader keeps it apart from the name (the relay)."""
    return [Finding(r["severity"], r["kind"], r.get("message") or "", node=node,
                    gpu=r.get("gpu"), port=r.get("port"), fs=r.get("fs"),
                    score=float(r.get("score") or 0.0), target=target)
            for r in rows]


def has_overview(hello: Any) -> bool:
    """Does this agent send overviews and findings (newer than 0.x agents)?"""
    return hello is not None and "overview" in (hello.families or ())
