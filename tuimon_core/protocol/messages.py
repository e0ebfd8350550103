"""Protocol v1 message types as Python objects, and their wire maps.

Every message is one msgpack map with ``v`` (protocol version) and ``t`` (type).
Values are SI base units; a value that could not be read is nil, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

PROTOCOL_VERSION = 1


@dataclass(slots=True)
class GpuInfo:
    """Static facts about one GPU, sent once in `hello`."""

    index: int
    uuid: str | None
    name: str | None
    mem_total: int | None
    power_limit: float | None
    pci_bus_id: str | None
    max_sm_clock: float | None
    max_mem_clock: float | None
    vbios: str | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    nvlinks: int | None = None
    nvlinks_total: int | None = None
    pcie_path: list[dict[str, Any]] | None = None

    def to_wire(self) -> dict[str, Any]:
        # The first eight always (as readers of the first release expect them); the later
        # ones where known, so a GPU without them encodes as it always did.
        out: dict[str, Any] = {}
        for i, name in enumerate(_GPU_INFO_NAMES):
            value = getattr(self, name)
            if i < 8 or value is not None:
                out[name] = value
        return out


# GpuInfo's field names, in order: asked once, not for each GPU of each hello.
_GPU_INFO_NAMES = tuple(f.name for f in fields(GpuInfo))


@dataclass(slots=True)
class Hello:
    """First message on every stream, and again whenever the inventory changes."""

    node: str
    agent_version: str
    boot_id: str | None
    interval: float
    ts: float
    gpus: list[GpuInfo] = field(default_factory=list)
    driver_version: str | None = None
    # Why the node has no readable GPUs (no driver, NVML failed); nil when NVML works.
    gpu_status: str | None = None
    families: list[str] = field(default_factory=list)
    host: dict[str, Any] = field(default_factory=dict)
    # Inventory sections later families add (fabric ports, file systems), by family.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        inventory: dict[str, Any] = {
            "gpus": [g.to_wire() for g in self.gpus],
            "driver_version": self.driver_version,
            "gpu_status": self.gpu_status,
        }
        inventory.update(self.extra)
        return {
            "v": PROTOCOL_VERSION,
            "t": "hello",
            "node": self.node,
            "agent_version": self.agent_version,
            "boot_id": self.boot_id,
            "interval": self.interval,
            "ts": self.ts,
            "families": list(self.families),
            "inventory": inventory,
            "host": dict(self.host),
        }


@dataclass(slots=True)
class Sample:
    """One reading of the node: per-GPU values in inventory order, host values."""

    seq: int
    ts: float
    interval: float
    gpus: list[dict[str, Any]] | None = None
    host: dict[str, Any] | None = None
    # Frames this stream client lost because it read too slowly, since it connected.
    dropped: int = 0
    # Families that later work adds (fabric, storage, steps, overview, findings), by name.
    extra: dict[str, Any] = field(default_factory=dict)
    # Not on the wire, nor part of the message's value (compare=False): where each
    # top-level key's bytes lie in the message as received, so a relay can forward a
    # subset of the families as the agent's own bytes, without encoding them again
    # (set by decode(deep=False), or found by sample_spans when needed).
    spans: dict[str, tuple[int, int]] | None = field(default=None, compare=False)
    # Not on the wire: the top-level keys as received (set by decode).
    keys: tuple[str, ...] | None = field(default=None, compare=False)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": PROTOCOL_VERSION,
            "t": "sample",
            "seq": self.seq,
            "ts": self.ts,
            "interval": self.interval,
        }
        if self.gpus is not None:
            out["gpus"] = self.gpus
        if self.host is not None:
            out["host"] = self.host
        if self.dropped:
            out["dropped"] = self.dropped
        out.update(self.extra)
        return out




@dataclass(slots=True)
class Event:
    """Something that happened once: an XID, an ECC error, a collector failing."""

    ts: float
    kind: str
    severity: str
    message: str
    gpu: int | None = None
    code: int | None = None
    # Which collector or family the event is about ("gpu", "host", ...), when any.
    source: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "v": PROTOCOL_VERSION,
            "t": "event",
            "ts": self.ts,
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "gpu": self.gpu,
            "code": self.code,
            "source": self.source,
        }


@dataclass(slots=True)
class Subscribe:
    """Client to agent: send me samples at most this often, and only these families."""

    interval: float | None = None
    families: list[str] | None = None
    # Relays only: the nodes to send (host names or Slurm host lists); agents ignore it.
    nodes: list[str] | None = None
    # Relays only: sources (as the relay's batches name them) to send with every family,
    # whatever `families` says: the nodes a viewer is looking at closely.
    detail: list[str] | None = None
    # The newest overview form the reader understands (overview_forms.py); None: it
    # predates the field, and is sent the first form.
    overview_form: int | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": PROTOCOL_VERSION,
            "t": "subscribe",
            "interval": self.interval,
            "families": self.families,
        }
        if self.nodes is not None:
            out["nodes"] = self.nodes
        if self.detail is not None:
            out["detail"] = self.detail
        if self.overview_form is not None:
            out["overview_form"] = self.overview_form
        return out


@dataclass(slots=True)
class Batch:
    """Relay to viewer: many nodes' frames in one message.

    Each frame is the node's own message, as bytes, under the name of its source (the
    target the relay connects to), so a viewer decodes it exactly as if it came from
    the agent. `sources` says which upstream connections changed state; `budget` is the
    relay's SLO ledger per job.
    """

    ts: float
    frames: list[tuple[str, bytes]] = field(default_factory=list)
    sources: list[tuple[str, str, str | None]] = field(default_factory=list)
    budget: dict[str, dict[str, Any]] | None = None
    relay: str | None = None
    dropped: int = 0
    # The relay's own judgement of the nodes it carries (since 2026-12): what it holds.
    judgement: dict[str, Any] | None = None
    # Not on the wire: why the batch's `budget` or `judgement` was refused (the rest of
    # the batch applies).
    budget_error: str | None = None
    judgement_error: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": PROTOCOL_VERSION,
            "t": "batch",
            "ts": self.ts,
            "relay": self.relay,
            # (source, bytes) pairs pack as msgpack arrays as they are: no list of lists
            # built per batch (thousands of frames, every quarter second, per viewer).
            "frames": self.frames,
        }
        if self.sources:
            out["sources"] = [list(s) for s in self.sources]
        if self.budget is not None:
            out["budget"] = self.budget
        if self.judgement is not None:
            out["judgement"] = self.judgement
        if self.dropped:
            out["dropped"] = self.dropped
        return out


Message = Hello | Sample | Event | Subscribe | Batch
