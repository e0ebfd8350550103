"""Encoding and bounded, validated decoding of protocol v1 messages."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

import msgpack

from tuimon_core.protocol.errors import ProtocolError
from tuimon_core.protocol.fields import (
    FABRIC_LEVEL_ORDER,
    FS_COLUMNS,
    GPU_FIELDS,
    GPU_INFO_FIELDS,
    GPU_LEVEL_ORDER,
    HOST_FIELDS,
)
from tuimon_core.protocol.messages import (
    PROTOCOL_VERSION,
    SEVERITIES,
    SOURCE_STATES,
    Batch,
    Event,
    GpuInfo,
    Hello,
    Message,
    Sample,
    Subscribe,
)
from tuimon_core.protocol.overview_forms import level_blob
from tuimon_core.protocol.text import clean, clean_tree

# One node's frame is a few KiB; a relay's batch holds many and has its own limit.
MAX_MESSAGE_BYTES = 1 << 20
MAX_BATCH_BYTES = 16 << 20
MAX_STR = 4096
MAX_ARRAY = 65536
MAX_MAP = 4096
MAX_GPUS = 64
# The overview and findings families (tuimon_core.overview).
MAX_FINDINGS = 256
MAX_FINDING_TEXT = 512
MAX_SHARED_FS = 256
# Messages up to this size are within every bound of unpack() by their size alone.
_WITHIN_EVERY_LIMIT = min(MAX_STR, MAX_ARRAY, MAX_MAP)

_GPU_SPEC = {f.key: f.kind for f in GPU_FIELDS}
_HOST_SPEC = {f.key: f.kind for f in HOST_FIELDS}
_INFO_SPEC = {f.key: f.kind for f in GPU_INFO_FIELDS}


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


def decode(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES,
           deep: bool = True) -> Message | None:
    """Decode and validate one message.

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
        return _decode(data, max_bytes, deep)
    except (AttributeError, TypeError) as exc:
        # A map key or value of a type no check expected (a binary where a string must
        # be, as a key): refused like any malformed message, never a crash of the
        # reader (a viewer's stream task, a relay's upstream).
        raise ProtocolError(f"malformed message: a key or value of the wrong type "
                            f"({exc})") from None


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
    return decode_map(unpack(data, max_bytes=max_bytes))


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
        raise ProtocolError(f"missing or invalid protocol version 'v': {_show(version)}")
    kind = m.get("t")
    if not isinstance(kind, str):
        raise ProtocolError(f"missing or invalid message type 't': {_show(kind)}")
    builder = _BUILDERS.get(kind)
    if builder is None:
        return None
    return builder(m)


# -- per type -------------------------------------------------------------------------


def _hello(m: dict[str, Any]) -> Hello:
    inventory = _opt_map(m, "inventory", "hello") or {}
    gpus_raw = inventory.get("gpus") or []
    if not isinstance(gpus_raw, list) or len(gpus_raw) > MAX_GPUS:
        raise ProtocolError("hello.inventory.gpus: expected a list of at most "
                            f"{MAX_GPUS} GPUs")
    gpus = []
    for i, g in enumerate(gpus_raw):
        where = f"hello.inventory.gpus[{i}]"
        if not isinstance(g, dict):
            raise ProtocolError(f"{where}: expected a map, got {_show(g)}")
        _check_fields(g, _INFO_SPEC, where)
        if not _is_int(g.get("index")):
            raise ProtocolError(f"{where}.index: required integer, got {_show(g.get('index'))}")
        # Checked against _INFO_SPEC above; absent fields are None.
        info: dict[str, Any] = {f.key: g.get(f.key) for f in GPU_INFO_FIELDS}
        gpus.append(GpuInfo(**info))
    extra = {k: v for k, v in inventory.items() if k not in ("gpus", "driver_version",
                                                              "gpu_status")}
    families = m.get("families") or []
    if not isinstance(families, list) or not all(isinstance(f, str) for f in families):
        raise ProtocolError("hello.families: expected a list of strings")
    host = _opt_map(m, "host", "hello") or {}
    # Inventory and host sections are free-form maps (ports, file systems, statuses):
    # every string in them is cleaned here, once per hello.
    clean_tree(host)
    clean_tree(extra)
    return Hello(
        node=_req_str(m, "node", "hello"),
        agent_version=_req_str(m, "agent_version", "hello"),
        boot_id=_opt_str(m, "boot_id", "hello"),
        interval=_req_pos_num(m, "interval", "hello"),
        ts=_req_num(m, "ts", "hello"),
        gpus=gpus,
        driver_version=_opt_str(inventory, "driver_version", "hello.inventory"),
        gpu_status=_opt_str(inventory, "gpu_status", "hello.inventory"),
        families=[clean(f) for f in families],
        host=host,
        extra=extra,
    )


_SAMPLE_KEYS = frozenset({"v", "t", "seq", "ts", "interval", "gpus", "host", "dropped"})


def _sample(m: dict[str, Any]) -> Sample:
    seq = m.get("seq")
    if (type(seq) is not int and not _is_int(seq)) or seq < 0:
        raise ProtocolError(f"sample.seq: expected a non-negative integer, got {_show(seq)}")
    gpus = m.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
            raise ProtocolError(f"sample.gpus: expected a list of at most {MAX_GPUS} maps")
        for i, g in enumerate(gpus):
            if not isinstance(g, dict):
                raise ProtocolError(f"sample.gpus[{i}]: expected a map, got {_show(g)}")
            _check_fields(g, _GPU_SPEC, f"sample.gpus[{i}]")
    host = m.get("host")
    if host is not None:
        if not isinstance(host, dict):
            raise ProtocolError(f"sample.host: expected a map, got {_show(host)}")
        _check_fields(host, _HOST_SPEC, "sample.host")
    dropped = m.get("dropped", 0)
    if (type(dropped) is not int and not _is_int(dropped)) or dropped < 0:
        raise ProtocolError(f"sample.dropped: expected a non-negative integer, got "
                            f"{_show(dropped)}")
    extra = {k: v for k, v in m.items() if k not in _SAMPLE_KEYS}
    if not extra.keys() <= _KNOWN_EXTRA:
        for key in [k for k in extra if k not in _KNOWN_EXTRA]:
            # A newer agent's family: kept for newer views, its strings cleaned like ours.
            extra[clean(key)] = clean_tree(extra.pop(key))
    if not extra.keys().isdisjoint(_ENTITY_FAMILIES):
        for family, lists in _ENTITY_FAMILIES.items():
            if family in extra:
                _check_entity_family(extra[family], lists, f"sample.{family}")
    if "steps" in extra:
        _check_steps(extra["steps"])
    if "overview" in extra:
        _check_overview(extra["overview"])
    if "findings" in extra:
        _check_findings(extra["findings"])
    # Every sample of every node: the usual float read inline, the rest as _req_num.
    ts = m.get("ts")
    if type(ts) is not float or ts - ts != 0:
        ts = _req_num(m, "ts", "sample")
    interval = m.get("interval")
    if type(interval) is not float or not 0 < interval < math.inf:
        interval = _req_pos_num(m, "interval", "sample")
    return Sample(seq, ts, interval, gpus, host, dropped, extra)  # positional: cheaper


_KNOWN_EXTRA = frozenset({"fabric", "storage", "steps", "overview", "findings"})


def _event(m: dict[str, Any]) -> Event:
    gpu = m.get("gpu")
    if gpu is not None and (not _is_int(gpu) or gpu < 0):
        raise ProtocolError(f"event.gpu: expected a GPU index or nil, got {_show(gpu)}")
    code = m.get("code")
    if code is not None and not _is_int(code):
        raise ProtocolError(f"event.code: expected an integer or nil, got {_show(code)}")
    severity = _req_str(m, "severity", "event")
    return Event(
        ts=_req_num(m, "ts", "event"),
        # Unknown kinds and severities pass: newer agents may add them.
        kind=_req_str(m, "kind", "event"),
        severity=severity,
        message=_opt_str(m, "message", "event") or "",
        gpu=gpu,
        code=code,
        source=_opt_str(m, "source", "event"),
    )


def _subscribe(m: dict[str, Any]) -> Subscribe:
    interval = m.get("interval")
    if interval is not None and (not _is_num(interval) or not 0 < interval <= 3600):
        raise ProtocolError(f"subscribe.interval: expected seconds in (0, 3600], got "
                            f"{_show(interval)}")
    families = m.get("families")
    if families is not None and (
        not isinstance(families, list) or not all(isinstance(f, str) for f in families)
    ):
        raise ProtocolError("subscribe.families: expected a list of family names or nil")
    nodes = m.get("nodes")
    if nodes is not None and (
        not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes)
    ):
        raise ProtocolError("subscribe.nodes: expected a list of host names or host lists, "
                            "or nil")
    detail = m.get("detail")
    if detail is not None and (
        not isinstance(detail, list) or len(detail) > MAX_DETAIL
        or not all(isinstance(n, str) and len(n) <= MAX_STR for n in detail)
    ):
        raise ProtocolError(f"subscribe.detail: expected a list of at most {MAX_DETAIL} "
                            "source names, or nil")
    form = m.get("overview_form")
    if form is not None and (type(form) is not int or not 1 <= form <= 255):
        raise ProtocolError(f"subscribe.overview_form: expected a form number (1..255) or "
                            f"nil, got {_show(form)}")
    return Subscribe(interval=float(interval) if interval is not None else None,
                     families=None if families is None else [clean(f) for f in families],
                     nodes=None if nodes is None else [clean(n) for n in nodes],
                     detail=None if detail is None else [clean(n) for n in detail],
                     overview_form=form)


# Nodes one viewer may take whole through a relay at once (a node screen, a short list).
MAX_DETAIL = 256


def _batch(m: dict[str, Any]) -> Batch:
    frames_raw = m.get("frames")
    if not isinstance(frames_raw, list):
        raise ProtocolError(f"batch.frames: expected a list, got {_show(frames_raw)}")
    frames = []
    for i, f in enumerate(frames_raw):
        if (not isinstance(f, list) or len(f) != 2 or not isinstance(f[0], str)
                or not isinstance(f[1], bytes)):
            raise ProtocolError(f"batch.frames[{i}]: expected [source name, frame bytes]")
        frames.append((f[0] if f[0].isprintable() else clean(f[0]), f[1]))
    sources = []
    for i, s in enumerate(m.get("sources") or []):
        if (not isinstance(s, list) or len(s) != 3 or not isinstance(s[0], str)
                or s[1] not in SOURCE_STATES or not (s[2] is None or isinstance(s[2], str))):
            raise ProtocolError(f"batch.sources[{i}]: expected [source, state, reason or nil]"
                                f" with state one of {', '.join(SOURCE_STATES)}")
        sources.append((clean(s[0]), s[1], None if s[2] is None else clean(s[2])))
    budget = m.get("budget")
    if budget is not None:
        if not isinstance(budget, dict):
            raise ProtocolError(f"batch.budget: expected a map, got {_show(budget)}")
        for job, entry in budget.items():
            if not isinstance(entry, dict):
                raise ProtocolError(f"batch.budget.{job}: expected a map")
            _check_values(entry, f"batch.budget.{job}", depth=1)
        budget = {clean(job): entry for job, entry in budget.items()}
    dropped = m.get("dropped", 0)
    if not _is_int(dropped) or dropped < 0:
        raise ProtocolError(f"batch.dropped: expected a count, got {_show(dropped)}")
    return Batch(ts=_req_num(m, "ts", "batch"), frames=frames, sources=sources, budget=budget,
                 relay=_opt_str(m, "relay", "batch"), dropped=dropped)


# Families whose sample section is a map of entity lists (ports, file systems, ...).
_ENTITY_FAMILIES = {"fabric": ("ports", "nics"), "storage": ("filesystems", "disks")}
MAX_ENTITIES = 4096


def _check_entity_family(value: Any, lists: tuple[str, ...], where: str) -> None:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: expected a map, got {_show(value)}")
    for key in lists:
        items = value.get(key)
        if items is None:
            continue
        if not isinstance(items, list) or len(items) > MAX_ENTITIES:
            raise ProtocolError(f"{where}.{key}: expected a list of at most {MAX_ENTITIES} maps")
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                raise ProtocolError(f"{where}.{key}[{i}]: expected a map with a string 'id'")
            _check_values(item, f"{where}.{key}[{i}]", depth=0)


_PLAIN = frozenset({int, bool, type(None)})


def _check_values(m: dict[str, Any], where: str, depth: int) -> None:
    """Entity values: numbers finite, strings bounded and cleaned, nested maps at most
    two deep."""
    bad_keys = False
    for key, v in m.items():
        if not key.isprintable():
            bad_keys = True
        t = type(v)
        if t is float:
            if v - v != 0:
                raise ProtocolError(f"{where}.{key}: expected a finite number, got {_show(v)}")
        elif t in _PLAIN:
            continue
        elif t is str:
            if len(v) > MAX_STR:
                raise ProtocolError(f"{where}.{key}: string longer than {MAX_STR}")
            if not v.isprintable():
                m[key] = clean(v)
        elif t is dict:
            if depth >= 2:
                raise ProtocolError(f"{where}.{key}: nested too deep")
            _check_values(v, f"{where}.{key}", depth + 1)
        elif t is list:
            for i, x in enumerate(v):
                tx = type(x)
                if (tx is float and x - x != 0) or tx not in (str, int, float):
                    raise ProtocolError(f"{where}.{key}: expected a list of finite scalars")
                if tx is str and not x.isprintable():
                    v[i] = clean(x)
        else:
            raise ProtocolError(f"{where}.{key}: unexpected {t.__name__}")
    if bad_keys:
        for key in [k for k in m if not k.isprintable()]:
            m[clean(key)] = m.pop(key)


def _check_steps(steps: Any) -> None:
    if not isinstance(steps, dict):
        raise ProtocolError(f"sample.steps: expected a map, got {_show(steps)}")
    jobs = steps.get("jobs") or []
    if not isinstance(jobs, list) or len(jobs) > MAX_ENTITIES:
        raise ProtocolError("sample.steps.jobs: expected a list of jobs")
    for i, job in enumerate(jobs):
        where = f"sample.steps.jobs[{i}]"
        if not isinstance(job, dict) or not isinstance(job.get("id"), str):
            raise ProtocolError(f"{where}: expected a map with a string 'id'")
        if not job["id"].isprintable():
            job["id"] = clean(job["id"])
        ranks = job.get("ranks") or []
        if not isinstance(ranks, list) or len(ranks) > MAX_ENTITIES:
            raise ProtocolError(f"{where}.ranks: expected a list")
        for j, rank in enumerate(ranks):
            if not isinstance(rank, dict) or not _is_int(rank.get("rank")):
                raise ProtocolError(f"{where}.ranks[{j}]: expected a map with an int 'rank'")
            _check_values(rank, f"{where}.ranks[{j}]", depth=1)


def _check_overview(ov: Any) -> None:
    """The overview family: level blobs, percents, port names, waits, file systems. Every
    length is bounded and every number's range checked, so a view can index and colour
    with what it holds and nothing else. Hot path (every node, every second, in every
    viewer): sequences are checked whole with C-level calls, not element by element. An
    overview of the first form (levels as maps, file systems as maps) is checked as it
    was and turned into the compact form, the one the views read."""
    if type(ov) is not dict:
        raise ProtocolError(f"sample.overview: expected a map, got {_show(ov)}")
    for key, limit in (("gpu_levels", MAX_GPUS), ("fabric_levels", MAX_ENTITIES)):
        blob = ov.get(key)
        if blob is not None and not _is_level_blob(blob, limit):
            raise ProtocolError(f"sample.overview.{key}: expected a count of metrics, then "
                                f"that many runs of at most {limit} level bytes (0..10)")
    if "gpu" in ov or "fabric" in ov:
        _first_form_levels(ov)
    busy = ov.get("busy")
    if busy is not None and not (type(busy) is bytes and len(busy) <= MAX_GPUS and
                                 not busy.translate(None, _PERCENT_BYTES)):
        raise ProtocolError("sample.overview.busy: expected one byte per GPU, a percent "
                            "(0..100) or 255 (unknown)")
    ports = ov.get("ports")
    if ports is not None:
        try:  # joined in C: a non-string fails here, and one check covers every name
            names = "".join(ports) if type(ports) is list else None
        except TypeError:
            names = None
        if names is None or len(ports) > MAX_ENTITIES or (
                ports and max(map(len, ports)) > MAX_STR):
            raise ProtocolError("sample.overview.ports: expected a list of port names")
        if not names.isprintable():
            ov["ports"] = [clean(p) for p in ports]
    wait = ov.get("wait")
    if wait is not None and not _is_waits(wait):
        raise ProtocolError("sample.overview.wait: expected a list of non-negative numbers")
    rows = ov.get("fs_rows")
    if rows is not None:
        if type(rows) is not list or len(rows) > MAX_SHARED_FS:
            raise ProtocolError(f"sample.overview.fs_rows: expected a list of at most "
                                f"{MAX_SHARED_FS} rows")
        for i, row in enumerate(rows):
            if type(row) is not list or len(row) < _FS_WIDTH or type(row[0]) is not str:
                raise ProtocolError(f"sample.overview.fs_rows[{i}]: expected a row "
                                    f"[{', '.join(FS_COLUMNS)}] with a string id")
            if len(row) > _FS_WIDTH:
                rows[i] = row = row[:_FS_WIDTH]  # a newer agent's columns
            if not _plain_row(row):
                _clean_row(row, f"sample.overview.fs_rows[{i}]")  # says what is wrong
    if "fs" in ov:
        _first_form_fs(ov)
    if not ov.keys() <= _OVERVIEW_KEYS:
        for key in [k for k in ov if k not in _OVERVIEW_KEYS]:
            ov[clean(key)] = clean_tree(ov.pop(key))  # a newer agent's section


def _is_level_blob(blob: Any, limit: int) -> bool:
    """A count k >= 1, then k runs of equal length <= limit, every byte a level (0..10).
    The count is removed with the levels when it is <= 10; a larger one is what is left."""
    if type(blob) is not bytes or not blob or blob[0] == 0:
        return False
    k = blob[0]
    cells, rest = divmod(len(blob) - 1, k)
    if rest or cells > limit:
        return False
    left = blob.translate(None, _LEVEL_BYTES)
    return not left or left == blob[:1]


def _first_form_levels(ov: dict[str, Any]) -> None:
    """`gpu` and `fabric` as maps of metric to level bytes (agents of the first overview
    form): checked, then made the blobs the views read."""
    for section, limit, order in (("gpu", MAX_GPUS, GPU_LEVEL_ORDER),
                                  ("fabric", MAX_ENTITIES, FABRIC_LEVEL_ORDER)):
        levels = ov.pop(section, None)
        if levels is None:
            continue
        if type(levels) is not dict or len(levels) > 64:
            raise ProtocolError(f"sample.overview.{section}: expected a map of metric to "
                                "levels")
        if not _all_levels(levels, limit):  # all metrics at once; then say which one
            for metric, values in levels.items():
                if type(metric) is not str or not _all_levels({metric: values}, limit):
                    raise ProtocolError(f"sample.overview.{section}.{_show(metric)}: expected "
                                        f"at most {limit} level bytes (0..10)")
        cells = max(map(len, levels.values()), default=0)
        # A metric the agent did not send is no data (level byte 0) in every cell.
        runs = [levels.get(key, b"")[:cells].ljust(cells, b"\0") for key in order]
        ov[f"{section}_levels"] = level_blob(runs)


def _first_form_fs(ov: dict[str, Any]) -> None:
    """`fs` as a list of maps (agents of the first overview form): checked, then made the
    rows the views read."""
    fs = ov.pop("fs")
    if type(fs) is not list or len(fs) > MAX_SHARED_FS:
        raise ProtocolError(f"sample.overview.fs: expected a list of at most "
                            f"{MAX_SHARED_FS} maps")
    for i, f in enumerate(fs):
        if type(f) is not dict or type(f.get("id")) is not str:
            raise ProtocolError(f"sample.overview.fs[{i}]: expected a map with a string "
                                "'id'")
        if not _plain_fs(f):
            _check_values(f, f"sample.overview.fs[{i}]", depth=2)  # says what is wrong
            if not _plain_row([f.get(c) for c in FS_COLUMNS]):
                raise ProtocolError(f"sample.overview.fs[{i}]: expected numbers or short "
                                    f"strings in {', '.join(FS_COLUMNS)}")
        fs[i] = [f.get(c) for c in FS_COLUMNS]
    ov["fs_rows"] = fs


_OVERVIEW_KEYS = frozenset({"gpu_levels", "busy", "ports", "fabric_levels", "wait",
                            "fs_rows"})
_FS_WIDTH = len(FS_COLUMNS)
# An overview's file system as agents build it: printable keys known in advance.
_FS_KEYS = frozenset(FS_COLUMNS)


def _plain_row(row: Iterable[Any]) -> bool:
    """A file system's row: finite numbers, nil, and short printable strings."""
    for v in row:
        t = type(v)
        if t is int or v is None:
            continue
        if t is float:
            if v - v != 0:
                return False
        elif t is not str or len(v) > MAX_STR or not v.isprintable():
            return False
    return True


def _clean_row(row: list[Any], where: str) -> None:
    """A row that is not plain: its strings cleaned in place, or what is wrong said."""
    for c, v in enumerate(row):
        t = type(v)
        if t is int or v is None:
            continue
        if t is float and v - v == 0:
            continue
        if t is str and len(v) <= MAX_STR:
            row[c] = clean(v)
            continue
        raise ProtocolError(f"{where}.{FS_COLUMNS[c]}: expected a finite number, a string of "
                            f"at most {MAX_STR} characters or nil, got {_show(v)}")


def _plain_fs(f: dict[Any, Any]) -> bool:
    """A shared file system of the overview's first form with only the known keys and
    plain values: true for every agent's, so the generic check (which cleans and says
    what is wrong) runs only for what is not."""
    return _FS_KEYS.issuperset(f) and _plain_row(f.values())


_NUM_OR_NIL: frozenset[type] = frozenset({int, float, type(None)})
_INT_ONLY = {int}


def _all_levels(levels: dict[Any, Any], limit: int) -> bool:
    """metric -> bytes, each at most `limit` long, every byte a level (0..10)."""
    for metric, data in levels.items():
        if type(data) is not bytes or type(metric) is not str or len(data) > limit:
            return False
    return not b"".join(levels.values()).translate(None, _LEVEL_BYTES)


# Deleting every valid byte leaves nothing: one C pass per check, not a loop.
_LEVEL_BYTES = bytes(range(11))
_PERCENT_BYTES = bytes([*range(101), 255])


def _is_waits(values: Any) -> bool:
    """Port waits: a list of at most MAX_ENTITIES finite numbers >= 0, nil allowed."""
    if type(values) is not list or len(values) > MAX_ENTITIES:
        return False
    types = set(map(type, values))
    if types == _INT_ONLY:  # the usual case: counter rates as whole ticks
        return min(values) >= 0
    if not types <= _NUM_OR_NIL:
        return False
    if None in values:
        values = [v for v in values if v is not None]
    return not values or (all(map(math.isfinite, values)) and min(values) >= 0)


def _check_findings(rows: Any) -> None:
    """The findings family: a node's rule conditions (docs/protocol.md)."""
    if type(rows) is not list or len(rows) > MAX_FINDINGS:
        raise ProtocolError(f"sample.findings: expected a list of at most {MAX_FINDINGS} maps")
    for i, r in enumerate(rows):
        where = f"sample.findings[{i}]"
        if type(r) is not dict:
            raise ProtocolError(f"{where}: expected a map, got {_show(r)}")
        if r.get("severity") not in SEVERITIES:
            raise ProtocolError(f"{where}.severity: expected one of {', '.join(SEVERITIES)}, "
                                f"got {_show(r.get('severity'))}")
        for key, limit in (("kind", 64), ("message", MAX_FINDING_TEXT), ("port", MAX_STR),
                           ("fs", MAX_STR)):
            v = r.get(key)
            if v is None and key != "kind":
                continue
            if type(v) is not str or len(v) > limit:
                raise ProtocolError(f"{where}.{key}: expected a string of at most {limit} "
                                    f"characters, got {_show(v)}")
            if not v.isprintable():
                r[key] = clean(v)
        gpu = r.get("gpu")
        if gpu is not None and (not _is_int(gpu) or not 0 <= gpu < MAX_GPUS):
            raise ProtocolError(f"{where}.gpu: expected a GPU index or nil, got {_show(gpu)}")
        score = r.get("score")
        if score is not None and (not _is_num(score) or not 0 <= score <= 1):
            raise ProtocolError(f"{where}.score: expected a number in 0..1, got {_show(score)}")


_BUILDERS: dict[str, Callable[[dict[str, Any]], Message]] = {
    "hello": _hello, "sample": _sample, "event": _event, "subscribe": _subscribe,
    "batch": _batch}


# -- value checks ------------------------------------------------------------------


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> TypeGuard[float]:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return True
    return isinstance(v, float) and math.isfinite(v)


def _show(v: Any) -> str:
    if v is None:
        return "nil"
    text = repr(v)
    return f"{type(v).__name__} {text[:40]}"


def _check_fields(values: dict[str, Any], spec: dict[str, str], where: str) -> None:
    # Hot path (every GPU of every node, every second): dispatch on exact types.
    unknown = False
    for key, value in values.items():
        kind = spec.get(key)
        if kind is None:
            unknown = True  # a newer agent's field: kept, its strings cleaned below
            continue
        if value is None:
            continue  # nil is "could not be read"
        t = type(value)
        if kind == "num":
            ok = (t is float and value - value == 0) or t is int  # NaN and inf fail
        elif kind == "int":
            ok = t is int and value >= 0
        elif kind == "str":
            ok = t is str and len(value) <= MAX_STR
            if ok and not value.isprintable():
                values[key] = clean(value)
        elif kind == "strlist":
            ok = t is list and all(type(s) is str and len(s) <= MAX_STR for s in value)
            if ok and not all(s.isprintable() for s in value):
                values[key] = [clean(s) for s in value]
        elif kind == "maplist":  # MIG instances: a short list of flat maps
            ok = t is list and len(value) <= MAX_GPUS and all(type(m) is dict for m in value)
            if ok:
                for j, item in enumerate(value):
                    _check_values(item, f"{where}.{key}[{j}]", depth=1)
        else:  # dict of str -> str
            ok = t is dict and all(type(s) is str for s in value.values())
            if ok and not all(k.isprintable() and s.isprintable() for k, s in value.items()):
                values[key] = {clean(k): clean(s) for k, s in value.items()}
        if not ok:
            raise ProtocolError(f"{where}.{key}: expected {_KIND_WORDS[kind]}, got "
                                f"{_show(value)}")
    if unknown:
        for key in [k for k in values if k not in spec]:
            values[clean(key)] = clean_tree(values.pop(key))


_KIND_WORDS = {
    "num": "a finite number or nil",
    "int": "a non-negative integer or nil",
    "str": f"a string of at most {MAX_STR} characters or nil",
    "strlist": "a list of strings or nil",
    "dict": "a map of strings or nil",
    "maplist": f"a list of at most {MAX_GPUS} maps or nil",
}


def _req_str(m: dict[str, Any], key: str, where: str) -> str:
    v = m.get(key)
    if not isinstance(v, str) or len(v) > MAX_STR:
        raise ProtocolError(f"{where}.{key}: required string, got {_show(v)}")
    return clean(v)


def _opt_str(m: dict[str, Any], key: str, where: str) -> str | None:
    v = m.get(key)
    if v is not None and (not isinstance(v, str) or len(v) > MAX_STR):
        raise ProtocolError(f"{where}.{key}: expected a string or nil, got {_show(v)}")
    return None if v is None else clean(v)


def _opt_map(m: dict[str, Any], key: str, where: str) -> dict[str, Any] | None:
    v = m.get(key)
    if v is not None and not isinstance(v, dict):
        raise ProtocolError(f"{where}.{key}: expected a map or nil, got {_show(v)}")
    return v


def _req_num(m: dict[str, Any], key: str, where: str) -> float:
    v = m.get(key)
    if not _is_num(v):
        raise ProtocolError(f"{where}.{key}: required finite number, got {_show(v)}")
    return float(v)


def _req_pos_num(m: dict[str, Any], key: str, where: str) -> float:
    v = _req_num(m, key, where)
    if v <= 0:
        raise ProtocolError(f"{where}.{key}: must be positive, got {v}")
    return v


__all__ = ["MAX_MESSAGE_BYTES", "PROTOCOL_VERSION", "decode", "decode_map", "encode",
           "encode_map", "unpack"]
