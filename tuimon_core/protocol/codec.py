"""Encoding and bounded, validated decoding of protocol v1 messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

import msgpack

from tuimon_core.node_states import SOURCE_STATES
from tuimon_core.protocol.errors import ProtocolError
from tuimon_core.protocol.fields import (
    BUDGET,
    EVENT_FIELDS,
    FAMILY_TYPES,
    GPU,
    GPU_INFO_FIELDS,
    HELLO_FIELDS,
    HOST,
    INTERVAL,
    JUDGEMENT,
    MAX_GPUS,
    SUBSCRIBE,
    TIME,
    Field,
)
from tuimon_core.protocol.messages import (
    PROTOCOL_VERSION,
    Batch,
    Event,
    GpuInfo,
    Hello,
    Message,
    Sample,
    Subscribe,
)
from tuimon_core.protocol.overview_checks import check_overview
from tuimon_core.protocol.schema import (
    MAX_STR,
    ListOf,
    Record,
    WireType,
    show,
    unknown_value,
)
from tuimon_core.protocol.text import clean

# One node's frame is a few KiB; a relay's batch holds many and has its own limit.
MAX_MESSAGE_BYTES = 1 << 20
MAX_BATCH_BYTES = 16 << 20
MAX_ARRAY = 65536
MAX_MAP = 4096
# Messages up to this size are within every bound of unpack() by their size alone.
_WITHIN_EVERY_LIMIT = min(MAX_STR, MAX_ARRAY, MAX_MAP)


def encode(message: Message) -> bytes:
    """Pack a message into one msgpack map."""
    return msgpack.packb(message.to_wire(), use_bin_type=True)


def map_header(n: int) -> bytes:
    """The msgpack header of a map of n pairs: a relay (or a replayed agent) joins
    already-encoded pairs under it."""
    return bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")


def encode_map(wire: dict[str, Any]) -> bytes:
    """Pack an already built wire map (used when a frame is filtered per client)."""
    return msgpack.packb(wire, use_bin_type=True)


def unpack(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> dict[str, Any]:
    """Bounded msgpack decode to a map, before any validation of its shape."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"message must be binary, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        if len(data) <= _WITHIN_EVERY_LIMIT:
            # Every message a second from every node: a frame this small cannot exceed
            # any bound below (n bytes hold at most n items), and parsing the bounds
            # costs a sixth of the unpack. Extension types are still refused.
            obj = msgpack.unpackb(data, max_ext_len=0)
        else:
            obj = msgpack.unpackb(
                data,
                raw=False,
                strict_map_key=True,
                use_list=True,
                max_str_len=min(max_bytes, MAX_STR * 16),
                # Binaries only appear as the node frames inside a relay's batch.
                max_bin_len=min(max_bytes, MAX_MESSAGE_BYTES),
                max_array_len=MAX_ARRAY,
                max_map_len=MAX_MAP,
                max_ext_len=0,
            )
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise ProtocolError(f"not a valid msgpack message: {exc or type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"message must be a map, got {type(obj).__name__}")
    return obj


def decode(data: bytes | dict[str, Any], *, max_bytes: int = MAX_MESSAGE_BYTES,
           deep: bool = True) -> Message | None:
    """Decode and validate one message: its bytes, or the map unpacking them would give
    (a source that builds frames from another system's data, as `tuimon prom` does,
    skips packing what it would unpack at once; the checks are the same).

    Returns None for a message type this version does not know (newer agents may send
    types older viewers skip). Raises ProtocolError, with a reason, for anything else
    that is not valid.

    `deep=False` is for a relay, which forwards a sample's bytes to viewers that check
    every value themselves (and keep a bad node's frame to that node): a sample's
    `gpus`, `host`, `fabric` and `storage` are then stepped over without being built
    (still parsed, so broken msgpack is still refused), and the Sample returned holds
    its envelope and `steps` only. Other types are decoded whole.
    """
    try:
        return decode_map(data) if isinstance(data, dict) else _decode(data, max_bytes, deep)
    except (AttributeError, TypeError) as exc:
        # A map key or value of a type no check expected (a binary where a string must
        # be, as a key): refused like any malformed message, never a crash of the
        # reader (a viewer's stream task, a relay's upstream).
        raise ProtocolError(f"malformed message: a key or value of the wrong type "
                            f"({exc})") from None
    except RecursionError:
        # A value nested deeper than any field (the overview a thousand lists deep).
        raise ProtocolError("malformed message: nested deeper than any field") from None


def _decode(data: bytes, max_bytes: int, deep: bool) -> Message | None:
    if not deep:
        if len(data) <= SMALL_FRAME_BYTES:
            # An overview-sized frame: one C-level unpack costs less than stepping over
            # its sections; its keys are kept, and where each lies is found only if a
            # relay must ever slice it (sample_spans).
            m = unpack(data, max_bytes=max_bytes)
            if m.get("t") == "sample":
                keys = tuple(k for k in m if type(k) is str)
                for key in _FORWARDED_UNREAD.intersection(m):
                    del m[key]
                message = decode_map(m)
                if isinstance(message, Sample):
                    message.keys = keys
                return message
            return decode_map(m)
        message = _sample_envelope(data, max_bytes)
        if message is not None:
            return message
    m = unpack(data, max_bytes=max_bytes)
    # A relay that checks every frame whole (it judges them) still forwards a sample's
    # families by slicing its bytes (sample_spans), not by encoding them again.
    keys = tuple(k for k in m if type(k) is str) if isinstance(m, dict) else None
    message = decode_map(m)
    if isinstance(message, Sample):
        message.keys = keys
    return message


# A relay reads frames up to this size whole (C), larger ones by stepping over sections.
SMALL_FRAME_BYTES = 2048


def sample_spans(data: bytes) -> dict[str, tuple[int, int]] | None:
    """Where each top-level key's bytes lie in a sample as received (None: not a
    well-formed sample), for a relay that forwards a subset of its families."""
    message = _sample_envelope(data, len(data))
    return None if message is None else message.spans


# Sections of a sample a relay forwards without reading.
_FORWARDED_UNREAD = frozenset({"gpus", "host", "fabric", "storage", "overview"})


def _sample_envelope(data: bytes, max_bytes: int) -> Sample | None:
    """The fast path of decode(deep=False): a Sample of envelope and steps, or None
    when the message is not a well-formed sample map (the full path then decodes it,
    or says exactly what is wrong)."""
    if not isinstance(data, (bytes, bytearray)) or not 0 < len(data) <= max_bytes:
        return None
    reader = msgpack.Unpacker(raw=False, strict_map_key=True, use_list=True,
                              max_buffer_size=len(data), max_str_len=MAX_STR * 16,
                              max_bin_len=MAX_MESSAGE_BYTES, max_array_len=MAX_ARRAY,
                              max_map_len=MAX_MAP, max_ext_len=0)
    reader.feed(data)
    m: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    try:
        for _ in range(reader.read_map_header()):
            start = reader.tell()
            key = reader.unpack()
            if key in _FORWARDED_UNREAD:
                reader.skip()
                m[key] = None
            else:
                m[key] = reader.unpack()
            if type(key) is str:
                spans[key] = (start, reader.tell())
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError):
        return None
    if reader.tell() != len(data) or m.get("t") != "sample" or not _is_int(m.get("v")) \
            or m["v"] < 1:
        return None
    if len(spans) != len(m):
        return None  # a repeated key: the full path says what is wrong
    for key in _FORWARDED_UNREAD:
        if m.get(key, 0) is None:
            del m[key]
    sample = _sample(m)  # the forwarded sections are gone from m: envelope, steps, findings
    sample.spans = spans
    sample.keys = tuple(spans)
    return sample


def decode_map(m: dict[str, Any]) -> Message | None:
    """Validate an unpacked wire map and build its message object."""
    version = m.get("v")
    if (type(version) is not int and not _is_int(version)) or version < 1:
        raise ProtocolError(f"missing or invalid protocol version 'v': {show(version)}")
    kind = m.get("t")
    if not isinstance(kind, str):
        raise ProtocolError(f"missing or invalid message type 't': {show(kind)}")
    builder = _BUILDERS.get(kind)
    if builder is None:
        return None
    return builder(m)


# -- per type -------------------------------------------------------------------------


_HELLO = {f.key: f for f in HELLO_FIELDS}
_INVENTORY_OWN = frozenset({"gpus", "driver_version", "gpu_status"})


def _hello(m: dict[str, Any]) -> Hello:
    f = _HELLO
    inventory = _field(m, f["inventory"], "hello") or {}
    gpus = [GpuInfo(**{g.key: info.get(g.key) for g in GPU_INFO_FIELDS})
            for info in inventory.get("gpus") or ()]
    return Hello(
        node=_field(m, f["node"], "hello"),
        agent_version=_field(m, f["agent_version"], "hello"),
        boot_id=_field(m, f["boot_id"], "hello"),
        interval=float(_field(m, f["interval"], "hello")),
        ts=float(_field(m, f["ts"], "hello")),
        gpus=gpus,
        driver_version=inventory.get("driver_version"),
        gpu_status=inventory.get("gpu_status"),
        families=_field(m, f["families"], "hello") or [],
        host=_field(m, f["host"], "hello") or {},
        # Ports, NICs, file systems, disks and statuses, checked by the inventory's record
        # (any may be nil: readers take `extra.get("ports") or ()`).
        extra={k: v for k, v in inventory.items() if k not in _INVENTORY_OWN},
    )


def _field(m: dict[str, Any], field: Field, where: str) -> Any:
    """One field of a message map, checked by its type (None when absent or nil)."""
    v = m.get(field.key)
    if v is None:
        if field.required:
            raise ProtocolError(f"{where}.{field.key}: required {field.type.words}, got nil")
        return None
    return field.type.check(v, f"{where}.{field.key}")


_SAMPLE_KEYS = frozenset({"v", "t", "seq", "ts", "interval", "gpus", "host", "dropped"})
_GPUS = ListOf(GPU, MAX_GPUS)


def _sample(m: dict[str, Any]) -> Sample:
    seq = m.get("seq")
    if type(seq) is not int or seq < 0:
        raise ProtocolError(f"sample.seq: expected a non-negative integer, got {show(seq)}")
    gpus = m.get("gpus")
    if gpus is not None:
        gpus = _GPUS.check(gpus, "sample.gpus")
    host = m.get("host")
    if host is not None:
        host = HOST.check(host, "sample.host")
    dropped = m.get("dropped", 0)
    if type(dropped) is not int or dropped < 0:
        raise ProtocolError(f"sample.dropped: expected a non-negative integer, got "
                            f"{show(dropped)}")
    extra = {k: v for k, v in m.items() if k not in _SAMPLE_KEYS}
    for key, value in extra.items():
        if value is None:
            continue
        kind = FAMILY_TYPES.get(key)
        if kind is not None:
            if value != [] or key != "findings":  # most samples: no findings
                extra[key] = kind.check(value, f"sample.{key}")
        elif key == "overview":
            check_overview(value)
        elif type(key) is not str or len(key) > MAX_STR:
            raise ProtocolError(f"sample: expected family names as keys, got {show(key)}")
    if not extra.keys() <= _KNOWN_EXTRA:
        for key in [k for k in extra if k not in _KNOWN_EXTRA]:
            # A newer agent's family: kept for newer views, its strings cleaned like ours.
            extra[clean(key)] = unknown_value(extra.pop(key), f"sample.{key}", 1)
    # Every sample of every node: the usual float read inline, the rest by their type.
    ts = m.get("ts")
    if type(ts) is not float or not 0 <= ts <= _TIME_HI:
        ts = float(_required(m, "ts", TIME, "sample"))
    interval = m.get("interval")
    if type(interval) is not float or not _INTERVAL.lo <= interval <= _INTERVAL.hi:
        interval = float(_required(m, "interval", _INTERVAL, "sample"))
    return Sample(seq, ts, interval, gpus, host, dropped, extra)  # positional: cheaper


_KNOWN_EXTRA = frozenset({"fabric", "storage", "steps", "overview", "findings"})
_TIME_HI = TIME.hi
_INTERVAL = INTERVAL


def _required(m: dict[str, Any], key: str, kind: WireType, where: str) -> Any:
    v = m.get(key)
    if v is None:
        raise ProtocolError(f"{where}.{key}: required {kind.words}, got nil")
    return kind.check(v, f"{where}.{key}")


_EVENT = Record("event", EVENT_FIELDS)


def _event(m: dict[str, Any]) -> Event:
    known: dict[str, Any] = {f.key: m.get(f.key) for f in EVENT_FIELDS}
    _EVENT.check(known, "event")
    return Event(ts=float(known["ts"]), kind=known["kind"], severity=known["severity"],
                 message=known["message"] or "", gpu=known["gpu"], code=known["code"],
                 source=known["source"])


def _subscribe(m: dict[str, Any]) -> Subscribe:
    known: dict[str, Any] = {f.key: m.get(f.key) for f in SUBSCRIBE.fields}
    SUBSCRIBE.check(known, "subscribe")
    interval = known["interval"]
    return Subscribe(interval=float(interval) if interval is not None else None,
                     families=known["families"], nodes=known["nodes"],
                     detail=known["detail"], overview_form=known["overview_form"])


def _batch(m: dict[str, Any]) -> Batch:
    frames_raw = m.get("frames")
    if type(frames_raw) is not list:
        raise ProtocolError(f"batch.frames: expected a list, got {show(frames_raw)}")
    frames = []
    for i, f in enumerate(frames_raw):
        if (type(f) is not list or len(f) != 2 or type(f[0]) is not str
                or len(f[0]) > MAX_STR or type(f[1]) is not bytes):
            raise ProtocolError(f"batch.frames[{i}]: expected [source name, frame bytes]")
        frames.append((f[0] if f[0].isprintable() else clean(f[0]), f[1]))
    sources = []
    raw_sources = m.get("sources") or []
    if type(raw_sources) is not list:
        raise ProtocolError(f"batch.sources: expected a list, got {show(raw_sources)}")
    for i, s in enumerate(raw_sources):
        if (type(s) is not list or len(s) != 3 or type(s[0]) is not str
                or len(s[0]) > MAX_STR or s[1] not in SOURCE_STATES
                or not (s[2] is None or (type(s[2]) is str and len(s[2]) <= MAX_STR))):
            raise ProtocolError(f"batch.sources[{i}]: expected [source, state, reason or nil]"
                                f" with state one of {', '.join(SOURCE_STATES)}")
        sources.append((clean(s[0]), s[1], None if s[2] is None else clean(s[2])))
    # The relay's own ledger and judgement are parts of its batch: each refused alone,
    # with the reason, and the nodes' frames in the batch still apply (a viewer then
    # shows its own count and judges the nodes itself).
    budget, budget_error = _alone(m.get("budget"), BUDGET, "batch.budget")
    judgement, judgement_error = _alone(m.get("judgement"), JUDGEMENT, "batch.judgement")
    dropped = m.get("dropped", 0)
    if type(dropped) is not int or dropped < 0:
        raise ProtocolError(f"batch.dropped: expected a count, got {show(dropped)}")
    relay = m.get("relay")
    if relay is not None and (type(relay) is not str or len(relay) > MAX_STR):
        raise ProtocolError(f"batch.relay: expected a string or nil, got {show(relay)}")
    return Batch(ts=float(_required(m, "ts", TIME, "batch")), frames=frames, sources=sources,
                 budget=budget, relay=None if relay is None else clean(relay), dropped=dropped,
                 budget_error=budget_error, judgement=judgement,
                 judgement_error=judgement_error)


def _alone(value: Any, kind: WireType, where: str) -> tuple[Any, str | None]:
    """(the value checked, None), or (None, why) where it does not check."""
    if value is None:
        return None, None
    try:
        return kind.check(value, where), None
    except ProtocolError as exc:
        return None, exc.reason


_BUILDERS: dict[str, Callable[[dict[str, Any]], Message]] = {
    "hello": _hello, "sample": _sample, "event": _event, "subscribe": _subscribe,
    "batch": _batch}


# -- value checks ------------------------------------------------------------------


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


__all__ = ["MAX_MESSAGE_BYTES", "PROTOCOL_VERSION", "decode", "decode_map", "encode",
           "encode_map", "unpack"]
