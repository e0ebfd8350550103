"""What the agent sends, fitted to the wire's schema: every frame passes its peers' checks.

A machine can hold what no viewer would accept: a 5,000-character user name, 300 mounts
of a shared file system, a mount path of escape characters that cleaning makes four
times longer, thousands of SR-IOV ports. The agent fits each sample and hello to the
types of the name table (`tuimon_core/protocol/fields.py`: strings cleaned and cut,
lists capped) and then to the frame size limit, cutting the longest entity lists
first and saying so in the family's `errors`, so the node stays on the wire with what
fits instead of every sample being refused.
"""

from __future__ import annotations

import logging
from typing import Any

from tuimon_core.protocol.codec import MAX_MESSAGE_BYTES, encode_map
from tuimon_core.protocol.fields import (
    EVENT_FIELDS,
    FAMILY_TYPES,
    GPU,
    GPU_INFO,
    HELLO_HOST,
    HOST,
    INVENTORY,
    MAX_GPUS,
    STR,
)
from tuimon_core.protocol.messages import Event, GpuInfo, Hello, Sample
from tuimon_core.protocol.schema import ListOf

log = logging.getLogger(__name__)

# Room left for what the agent adds after fitting (`dropped`) and for msgpack headers.
FRAME_BUDGET = MAX_MESSAGE_BYTES - 4096
_GPUS = ListOf(GPU, MAX_GPUS)
# An event's texts share one type (the table's); its other fields are the agent's own.
_EVENT_TEXT = next(f.type for f in EVENT_FIELDS if f.key == "message")
# The entity lists a frame can be cut in, by family: what grows with the machine.
_CUTTABLE = (("storage", "filesystems"), ("storage", "disks"), ("fabric", "ports"),
             ("fabric", "nics"))


def fit_values(gpus: list[dict[str, Any]] | None, host: dict[str, Any] | None,
               extra: dict[str, Any]) -> tuple[list[dict[str, Any]] | None,
                                               dict[str, Any] | None]:
    """A sample's collected values as the wire allows them (`extra` in place)."""
    for family, values in extra.items():
        kind = FAMILY_TYPES.get(family)
        if kind is not None and values is not None:
            extra[family] = kind.fit(values)
    return (None if gpus is None else _GPUS.fit(gpus),
            None if host is None else HOST.fit(host))


def fit_event(event: Event) -> Event:
    """The event's texts as the wire allows them (a collector's error may be any length)."""
    wire = event.to_wire()
    for key in ("message", "kind", "source"):
        value = wire.get(key)
        if value is not None:
            wire[key] = _EVENT_TEXT.fit(value)
    event.message, event.kind, event.source = wire["message"] or "", wire["kind"] or "event", \
        wire["source"]
    return event


def fit_hello(hello: Hello) -> Hello:
    """The hello's names and inventory as the wire allows them."""
    inventory = INVENTORY.fit({"gpus": [g.to_wire() for g in hello.gpus], **hello.extra})
    gpus = [GpuInfo(**g) for g in inventory.pop("gpus") or () if GPU_INFO.fit(g)]
    hello.node = STR.fit(hello.node)
    hello.gpus = gpus
    hello.driver_version = STR.fit(hello.driver_version) if hello.driver_version else None
    hello.gpu_status = STR.fit(hello.gpu_status) if hello.gpu_status else None
    hello.host = HELLO_HOST.fit(hello.host) or {}
    hello.extra = {k: v for k, v in inventory.items() if k not in ("driver_version",
                                                                   "gpu_status")}
    return hello


def fit_frame(sample: Sample, limit: int = FRAME_BUDGET) -> bytes:
    """The sample's bytes, within `limit`: when it is larger, its longest entity list is
    halved until it fits, and what was left out is said in that family's `errors`.
    Returns the encoding."""
    def cut(family: str, key: str, total: int, kept: int) -> None:
        errors = sample.extra[family].setdefault("errors", {})
        errors[f"{key}_cut"] = (f"{total - kept} of {total} {key} left out: the frame was "
                                f"over {limit} bytes")

    return _shrink(sample.extra, lambda: encode_map(sample.to_wire()), limit, cut)


def fit_hello_frame(hello: Hello, limit: int = FRAME_BUDGET) -> bytes:
    """The hello's bytes, within `limit`, its inventory lists cut as a sample's are."""
    inventory = {"storage": hello.extra, "fabric": hello.extra}

    def cut(_: str, key: str, total: int, kept: int) -> None:
        log.warning("%s: the hello's inventory lists %d of %d %s: the frame was over %d "
                    "bytes", hello.node, kept, total, key, limit)

    return _shrink(inventory, lambda: encode_map(hello.to_wire()), limit, cut)


def _shrink(families: dict[str, Any], encode: Any, limit: int, cut: Any) -> bytes:
    data: bytes = encode()
    before: dict[tuple[str, str], int] = {}  # each list's length before any cut
    while len(data) > limit:
        family, key = max(_CUTTABLE, key=lambda fk: len(
            (families.get(fk[0]) or {}).get(fk[1]) or ()))
        items = (families.get(family) or {}).get(key) or []
        if len(items) <= 1:
            break  # nothing left to cut: its readers refuse it, saying why
        keep = len(items) // 2
        total = before.setdefault((family, key), len(items))
        families[family][key] = items[:keep]
        cut(family, key, total, keep)
        data = encode()
    return data
