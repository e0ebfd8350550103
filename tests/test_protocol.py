"""Protocol v1: golden vectors, round trips of every message type, hostile input."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.schema_values import valid
from tuimon_core.protocol import (
    MAX_MESSAGE_BYTES,
    Event,
    GpuInfo,
    Hello,
    ProtocolError,
    Sample,
    Subscribe,
    decode,
    encode,
    encode_map,
)
from tuimon_core.protocol.fields import GPU, HOST

VECTORS = Path(__file__).parent / "vectors"
VALID = sorted(p.stem for p in VECTORS.glob("*.msgpack"))
INVALID_REASONS = json.loads((VECTORS / "invalid" / "reasons.json").read_text())


def test_every_vector_has_its_json() -> None:
    assert "hello" in VALID and "sample" in VALID and "event_xid" in VALID
    for name in VALID:
        assert (VECTORS / f"{name}.json").exists()


def _bins(obj: dict[str, object]) -> object:
    """A msgpack bin, as the JSON twins of the vectors write it."""
    return bytes.fromhex(obj["$bin"]) if obj.keys() == {"$bin"} else obj  # type: ignore[arg-type]


@pytest.mark.parametrize("name", VALID)
def test_golden_vector_decodes_to_its_json_and_reencodes_to_the_same_bytes(name: str) -> None:
    data = (VECTORS / f"{name}.msgpack").read_bytes()
    expected = json.loads((VECTORS / f"{name}.json").read_text(), object_hook=_bins)
    assert msgpack.unpackb(data, raw=False) == expected
    message = decode(data)
    if name == "future_type_ignored":
        assert message is None
        return
    assert message is not None
    if name == "sample_overview_first_form":
        # The first form is read as the compact form the same node sends today.
        compact = decode((VECTORS / "sample_overview.msgpack").read_bytes())
        assert isinstance(message, Sample) and isinstance(compact, Sample)
        assert message.extra == compact.extra
        return
    if name.startswith("future_"):
        # Unknown fields pass through untouched; known ones decode as usual.
        assert isinstance(message, Sample)
        assert message.gpus == [{"util": 0.5, "tensor_core_util": 0.4}]
        assert message.extra == {"fabric": {"ports": []}}
        return
    assert encode(message) == data


def test_sample_vector_values_are_si_and_nil_for_unreadable() -> None:
    sample = decode((VECTORS / "sample.msgpack").read_bytes())
    assert isinstance(sample, Sample)
    gpu = sample.gpus[0]
    assert gpu["power"] == 640.5  # watts, not milliwatts
    assert gpu["sm_clock"] == 1.98e9  # hertz, not MHz
    assert 0 <= gpu["util"] <= 1
    assert sample.gpus[1]["failed"] == "GPU is lost"
    unreadable = decode((VECTORS / "sample_unreadable_fields.msgpack").read_bytes())
    assert unreadable.gpus[0]["power"] is None
    assert unreadable.gpus[0]["errors"]["power"] == "Insufficient Permissions"


@pytest.mark.parametrize("name", sorted(INVALID_REASONS))
def test_invalid_vectors_raise_the_typed_error_with_a_reason(name: str) -> None:
    data = (VECTORS / "invalid" / f"{name}.msgpack").read_bytes()
    with pytest.raises(ProtocolError) as err:
        decode(data)
    assert INVALID_REASONS[name] in err.value.reason


def test_oversized_message_is_refused_before_unpacking() -> None:
    data = msgpack.packb({"v": 1, "t": "sample", "pad": "x" * (MAX_MESSAGE_BYTES + 1)})
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(data)


def test_huge_declared_lengths_are_refused() -> None:
    # A map header claiming 2**31 entries must fail fast, not allocate.
    with pytest.raises(ProtocolError):
        decode(b"\xdf\x7f\xff\xff\xff")
    with pytest.raises(ProtocolError):
        decode(b"\xdd\x7f\xff\xff\xff")


def test_deep_nesting_is_refused_not_a_crash() -> None:
    data = b"\x91" * 100_000 + b"\xc0"
    with pytest.raises(ProtocolError):
        decode(data)


def test_non_finite_and_boolean_numbers_are_refused() -> None:
    for bad in (float("nan"), float("inf"), True):
        data = msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                              "gpus": [{"power": bad}]})
        with pytest.raises(ProtocolError, match=r"sample.gpus\[0\].power"):
            decode(data)


# -- round trips -----------------------------------------------------------------------

names = st.text(min_size=1, max_size=40)
maybe_num = st.none() | st.floats(min_value=0, max_value=1e15, allow_nan=False) | st.integers(
    0, 2**53)


# Every GPU and host field, drawn from the schema (tests/schema_values.py).
gpu_values = valid(GPU, nil=False)
host_values = valid(HOST, nil=False)
gpu_info = st.builds(
    GpuInfo, index=st.integers(0, 63), uuid=st.none() | names, name=st.none() | names,
    mem_total=st.none() | st.integers(0, 2**40), power_limit=st.none() | st.floats(0, 2000),
    pci_bus_id=st.none() | names, max_sm_clock=st.none() | st.floats(0, 5e9),
    max_mem_clock=st.none() | st.floats(0, 5e9))
timestamps = st.floats(min_value=0, max_value=4e9)
intervals = st.floats(min_value=0.01, max_value=3600)

hellos = st.builds(
    Hello, node=names, agent_version=names, boot_id=st.none() | names, interval=intervals,
    ts=timestamps, gpus=st.lists(gpu_info, max_size=8), driver_version=st.none() | names,
    gpu_status=st.none() | names, families=st.lists(names, max_size=5),
    host=st.dictionaries(names, st.none() | names, max_size=3))
samples = st.builds(
    Sample, seq=st.integers(0, 2**63 - 1), ts=timestamps, interval=intervals,
    gpus=st.none() | st.lists(gpu_values, max_size=8), host=st.none() | host_values,
    dropped=st.integers(0, 2**31))
events = st.builds(
    Event, ts=timestamps, kind=names, severity=st.sampled_from(["info", "warning", "critical"]),
    message=st.text(max_size=200), gpu=st.none() | st.integers(0, 63),
    code=st.none() | st.integers(-(2**31), 2**31 - 1), source=st.none() | names)
subscribes = st.builds(
    Subscribe, interval=st.none() | st.floats(min_value=0.001, max_value=3600),
    families=st.none() | st.lists(names, max_size=5))


@settings(max_examples=150, deadline=None)
@given(st.one_of(hellos, samples, events, subscribes))
def test_every_message_type_round_trips(message) -> None:  # type: ignore[no-untyped-def]
    """What is printable arrives unchanged; anything unprintable (a control character in
    a name, a key or a reason) arrives escaped, never raw."""
    decoded = decode(encode(message))
    assert all(s.isprintable() for s in _strings(decoded.to_wire()))
    if all(s.isprintable() for s in _strings(message.to_wire())):
        assert decoded == message
    else:
        assert type(decoded) is type(message)


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_strings_are_cleaned_where_they_enter() -> None:
    hello = decode(encode(Hello(
        node="evil\x1b]0;pwned\x07", agent_version="1", boot_id=None, interval=1.0, ts=1.0,
        extra={"ports": [{"id": "mlx5_0:1\x1b[2J", "state_name": "DOWN\u202e"}]})))
    assert hello.node == "evil\\x1b]0;pwned\\x07"
    assert hello.extra["ports"][0] == {"id": "mlx5_0:1\\x1b[2J", "state_name": "DOWN\\u202e"}
    sample = decode(encode(Sample(seq=1, ts=1.0, interval=1.0, gpus=[
        {"failed": "lost\n FAKE: ok", "errors": {"temp\x07": "bad\r"}}], extra={
        "steps": {"jobs": [{"id": "job\nFAKE: ok", "world": 1, "ranks": []}]}})))
    assert sample.gpus == [{"failed": "lost\\x0a FAKE: ok", "errors": {"temp\\x07": "bad\\x0d"}}]
    assert sample.extra["steps"]["jobs"][0]["id"] == "job\\x0aFAKE: ok"
    with pytest.raises(ProtocolError) as err:
        decode(encode_map({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                           "fabric": {"ports": [{"id": "p", "x\x1b[2J": float("nan")}]}}))
    assert "\x1b" not in err.value.reason and "x\\x1b[2J" in err.value.reason


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_raise_the_typed_error(data: bytes) -> None:
    try:
        decode(data)
    except ProtocolError as exc:
        assert exc.reason


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(
        max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.text(max_size=10), children, max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["hello", "sample", "event", "subscribe"]),
       st.dictionaries(st.sampled_from(["seq", "ts", "interval", "gpus", "host", "node",
                                        "agent_version", "inventory", "kind", "severity",
                                        "gpu", "code", "families", "dropped", "message"]),
                       json_like, max_size=8))
def test_wrongly_shaped_messages_raise_the_typed_error(kind: str, fields: dict) -> None:
    data = msgpack.packb({"v": 1, "t": kind, **fields}, use_bin_type=True)
    try:
        decode(data)
    except ProtocolError as exc:
        assert exc.reason


def test_the_hello_gpu_message_holds_every_field_of_its_table() -> None:
    """GpuInfo is built from the table's keys: one list, checked."""
    import dataclasses

    from tuimon_core.protocol.fields import GPU_INFO_FIELDS

    assert [f.name for f in dataclasses.fields(GpuInfo)] == [f.key for f in GPU_INFO_FIELDS]


def test_a_relays_judgement_reads_as_findings_and_a_bad_one_is_refused_alone() -> None:
    """The batch_judgement vector's findings, with their components by field, the host
    list expanded and the true onsets; a judgement that does not check is refused with
    the reason while the batch's frames and states apply."""
    from tuimon_core.findings_family import findings_from_judgement, judgement_to_wire
    from tuimon_core.protocol import Batch

    batch = decode((VECTORS / "batch_judgement.msgpack").read_bytes())
    assert isinstance(batch, Batch) and batch.judgement is not None
    leaf, straggler = findings_from_judgement(batch.judgement)
    assert (leaf.kind, leaf.leaf, len(leaf.nodes), leaf.first_seen) == (
        "congestion", "leaf01", 16, 1796000180.0)
    assert (straggler.node, straggler.gpu, straggler.job) == ("gpu042", 3, "llm-pretrain")
    # Back to the wire as the relay sends it: the same rows.
    again = judgement_to_wire([leaf, straggler], 1796003000.0)
    assert again == batch.judgement
    bad = msgpack.unpackb((VECTORS / "batch_judgement.msgpack").read_bytes(), raw=False)
    del bad["judgement"]["findings"][1]["since"]
    refused = decode(msgpack.packb(bad, use_bin_type=True))
    assert isinstance(refused, Batch) and refused.judgement is None
    assert "batch.judgement.findings[1].since" in (refused.judgement_error or "")
    assert refused.sources == [("gpu042:9477", "up", None)]
