"""Fuzzing from the schema: every field the name table declares, given what its type
does not allow, is refused at decode naming the field; and any frame the schema allows,
however hostile its values (bounds, huge numbers, markup, escapes), is drawn by every
view without an error, through a real relay, the app, `status`, the readout and a replay.

The frames are built from tuimon_core.protocol.fields (tests/schema_values.py), so a
field added to the table is tried here without a test naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import random
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.schema_values import example, mutants, random_valid, valid, wrong
from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.judgement import Judgement
from tuimon.model.storage import StorageView
from tuimon_core.protocol import Batch, ProtocolError, decode, encode_map, schema
from tuimon_core.protocol.fields import (
    EVENT_FIELDS,
    FAMILY_TYPES,
    FS_COLUMNS,
    GPU,
    HELLO_FIELDS,
    HOST,
    MAX_GPUS,
    TABLES,
)
from tuimon_core.protocol.schema import Record

HELLO = Record("hello", HELLO_FIELDS)
EVENT = Record("event", EVENT_FIELDS)


def _hello(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "t": "hello", **example(HELLO), **fields}


def _sample(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0, **fields}


def _inventory(key: str, value: Any) -> dict[str, Any]:
    return _hello(inventory={key: [value]})


def _family(family: str, key: str, value: Any) -> dict[str, Any]:
    return _sample(**{family: {key: [value]}})


# Where each table's record lives in a message: the record's value -> the message map.
PLACES: dict[str, Callable[[Any], dict[str, Any]]] = {
    "hello": lambda v: {"v": 1, "t": "hello", **v},
    "hello.inventory": lambda v: _hello(inventory=v),
    "hello.host": lambda v: _hello(host=v),
    "inventory.gpus[]": lambda v: _inventory("gpus", v),
    "inventory.ports[]": lambda v: _inventory("ports", v),
    "pcie_path[]": lambda v: _inventory("gpus", {"index": 0, "pcie_path": [v]}),
    "inventory.nics[]": lambda v: _inventory("nics", v),
    "inventory.filesystems[]": lambda v: _inventory("filesystems", v),
    "inventory.disks[]": lambda v: _inventory("disks", v),
    "sample.gpus[]": lambda v: _sample(gpus=[v]),
    "process": lambda v: _sample(gpus=[{"processes": [v]}]),
    "mig": lambda v: _sample(gpus=[{"mig": [v]}]),
    "sample.host": lambda v: _sample(host=v),
    "sample.fabric": lambda v: _sample(fabric=v),
    "fabric.ports[]": lambda v: _family("fabric", "ports", v),
    "fabric.nics[]": lambda v: _family("fabric", "nics", v),
    "sample.storage": lambda v: _sample(storage=v),
    "storage.filesystems[]": lambda v: _family("storage", "filesystems", v),
    "storage.disks[]": lambda v: _family("storage", "disks", v),
    "sample.steps": lambda v: _sample(steps=v),
    "steps.jobs[]": lambda v: _family("steps", "jobs", v),
    "jobs[].ranks[]": lambda v: _sample(steps={"jobs": [{"id": "j", "world": 2,
                                                          "ranks": [v]}]}),
    "jobs[].windows[]": lambda v: _sample(steps={"jobs": [{"id": "j", "world": 2,
                                                            "windows": [v]}]}),
    "jobs[].total": lambda v: _sample(steps={"jobs": [{"id": "j", "world": 2, "total": v}]}),
    "jobs[].drop": lambda v: _sample(steps={"jobs": [{"id": "j", "world": 2, "drop": v}]}),
    "overview.fs_rows[]": lambda v: _sample(overview={"fs_rows": [[v.get(c)
                                                                    for c in FS_COLUMNS]]}),
    "sample.findings[]": lambda v: _sample(findings=[v]),
    "event": lambda v: {"v": 1, "t": "event", **v},
    "subscribe": lambda v: {"v": 1, "t": "subscribe", **v},
    "batch.budget.<job>": lambda v: {"v": 1, "t": "batch", "ts": 1.0, "frames": [],
                                     "budget": {"job": v}},
    "batch.judgement": lambda v: {"v": 1, "t": "batch", "ts": 1.0, "frames": [],
                                  "judgement": v},
    "judgement.findings[]": lambda v: {"v": 1, "t": "batch", "ts": 1.0, "frames": [],
                                       "judgement": {"at": 1.0, "findings": [v]}},
}


def test_every_table_has_a_place_in_a_message() -> None:
    assert PLACES.keys() == TABLES.keys()


def test_every_field_refuses_what_its_type_does_not_allow() -> None:
    """For each field of each table: the record with that one field another type, out of
    bounds, too long, too deep or (required) missing is refused, and the reason names
    the field's path; the record as the schema allows it decodes."""
    tried: set[str] = set()
    for name, fields in TABLES.items():
        record = Record(name, fields)
        place = PLACES[name]
        decode(encode_map(place(example(record))))  # the valid one goes through
        for path, bad in mutants(record):
            data = encode_map(place(bad))
            # The reason names the field where it is: `...processes[0].pid: ...`.
            named = re.compile(r"\." + r"(\[\d+\])?\.".join(map(re.escape, path.split(".")))
                               + r"(\[\d+\]|\.[^.:\[]+)?:")  # an item, or a map's key
            if name == "batch.budget.<job>":
                # A relay's budget is refused alone: the batch's frames still apply.
                batch = decode(data)
                assert isinstance(batch, Batch) and batch.budget is None
                assert named.search(batch.budget_error or ""), (path, batch.budget_error)
            elif name.startswith(("batch.judgement", "judgement.")):
                # So is its judgement: the viewer then judges the nodes itself.
                batch = decode(data)
                assert isinstance(batch, Batch) and batch.judgement is None
                assert named.search(batch.judgement_error or ""), (path,
                                                                   batch.judgement_error)
            else:
                with pytest.raises(ProtocolError) as err:
                    decode(data)
                assert named.search(err.value.reason), (name, path, err.value.reason)
            tried.add(f"{name}.{path.split('.', 1)[0]}")
    assert tried == {f"{name}.{f.key}" for name, fields in TABLES.items() for f in fields}


def test_a_map_of_few_keys_is_checked_as_one_of_all_its_keys(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A map holding a few of a record's keys (a Prometheus GPU: three of 47) is checked
    key by key, a fuller one by the written-out tests: for every field of every table,
    both keep, clean and refuse the same values with the same reason."""
    with monkeypatch.context() as m:
        m.setattr(schema, "SPARSE_SHARE", 10**9)  # written out for all but an empty map
        written = {name: Record(name, fields) for name, fields in TABLES.items()}
    by_key = 0
    for name, fields in TABLES.items():
        record = Record(name, fields)
        required = {f.key: example(f.type) for f in fields if f.required}
        for f in fields:
            for value in [example(f.type), None, "a\x1b[31mb\n", 1.5, -1, *wrong(f.type)]:
                for extra in ({}, {"newer_field": "x\x07"}):
                    v = {**required, f.key: value, **extra}
                    by_key += len(v) <= len(fields) // schema.SPARSE_SHARE
                    said = []
                    for rec in (record, written[name]):
                        try:
                            said.append(("kept", rec.check(copy.deepcopy(v), "sample.x")))
                        except ProtocolError as exc:
                            said.append(("refused", exc.reason))
                    assert said[0] == said[1], (name, f.key, value, said)
    assert by_key > 200  # the key-by-key check was tried, not only the written-out one


def test_a_value_nested_deeper_than_python_prints_is_refused_not_a_crash() -> None:
    """A ~1 KB overview a thousand lists deep: its error used to be a RecursionError
    (from printing it), which no reader caught."""
    from tests.schema_values import deep_frame

    with pytest.raises(ProtocolError, match=r"sample\.overview: expected a map"):
        decode(deep_frame())


# -- any valid frame is drawn ---------------------------------------------------------------

valid_samples = st.fixed_dictionaries(
    {"gpus": st.lists(valid(GPU, nil=False), max_size=3),
     "host": valid(HOST, nil=False)},
    optional={family: valid(kind, nil=False) for family, kind in FAMILY_TYPES.items()})


def _judge(cluster: ClusterState) -> tuple[Judgement, list[Any]]:
    watch = Judgement(cluster, StorageView(), EfficiencyView(), Diagnosis())
    return watch, watch.update()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hello=valid(HELLO, nil=False), samples=st.lists(valid_samples, min_size=1, max_size=3))
def test_any_frame_the_schema_allows_is_judged_and_printed(hello: dict[str, Any],
                                                           samples: list[Any]) -> None:
    """The model, the judgement, the plain readout and `status` over frames drawn from
    the schema: no part fails (an internal error would be a bug the schema let in)."""
    from tuimon.readout import render
    from tuimon.status import format_text, report

    cluster = ClusterState()
    decoded = decode(encode_map({"v": 1, "t": "hello", **hello}))
    cluster.apply_message("n1:9477", decoded)
    for i, s in enumerate(samples):
        cluster.apply_message("n1:9477", decode(encode_map(_sample(seq=i, **s))))
    watch, findings = _judge(cluster)
    assert watch.diagnosis.guard.failures == 0, watch.diagnosis.guard.errors
    render(cluster)
    format_text(report(cluster, watch.efficiency, findings, "ok"))


# -- end to end: hostile frames through a relay into the app, status and a replay -----------


def _frames(seed: int, count: int) -> list[bytes]:
    """A hostile agent's stream: hellos and samples the schema allows with hostile
    values, and every so often one with a field of the wrong type (refused)."""
    rng = random.Random(seed)
    bad_samples = [bad for _, bad in mutants(Record("gpu", GPU.fields))][:40]
    bad_fs = [bad for _, bad in mutants(Record("fs", TABLES["storage.filesystems[]"]))][:40]
    out = []
    for i in range(count):
        if i % 10 == 0:
            hello = random_valid(HELLO, rng)
            hello.update(node="hostile", interval=0.1)
            hello.setdefault("inventory", {})
            if hello["inventory"] is not None:
                gpus = hello["inventory"].get("gpus") or []
                for j, g in enumerate(gpus[:MAX_GPUS]):
                    g["index"] = j
            out.append(encode_map({"v": 1, "t": "hello", **hello}))
            continue
        sample: dict[str, Any] = {"gpus": [random_valid(GPU, rng) for _ in range(2)],
                                  "host": random_valid(HOST, rng)}
        for family, kind in FAMILY_TYPES.items():
            if rng.random() < 0.8:
                sample[family] = random_valid(kind, rng)
        if i % 7 == 3:
            sample["gpus"] = [rng.choice(bad_samples)]
        elif i % 7 == 5:
            sample["storage"] = {"filesystems": [rng.choice(bad_fs)]}
        out.append(encode_map(_sample(seq=i, ts=time.time(), interval=0.1, **sample)))
    out.append(encode_map({"v": 1, "t": "event", **random_valid(EVENT, rng)}))
    return out


@contextlib.asynccontextmanager
async def _agents(behaviours: list[Callable[[web.WebSocketResponse], Any]]
                  ) -> AsyncIterator[list[str]]:
    from tests.test_hostile import fake_agents

    async def wrap(behave: Callable[[web.WebSocketResponse], Any]) -> Any:
        async def inner(ws: web.WebSocketResponse, _: web.Request) -> None:
            await behave(ws)
        return inner

    async with fake_agents([await wrap(b) for b in behaviours]) as targets:
        yield targets


async def test_hostile_frames_through_a_relay_into_the_app_status_and_a_replay(
        tmp_path: Path, proc_root: Path) -> None:
    """One honest agent and one whose every frame is hostile (schema-valid with markup,
    escapes and extreme numbers, or one field of the wrong type), behind a real relay:
    the app draws both maps and the hostile node's screen, `status` and the readout
    print, and the recording plays back; no part of any of them fails, the honest node
    stays up, and the refused frames are named on the hostile node."""
    from tests.conftest import make_agent
    from tuimon.readout import render
    from tuimon.relay import Relay, RelayConfig
    from tuimon.sources.agent_stream import StreamOptions, watching
    from tuimon.sources.recording import (
        RecordingWriter,
        ReplayControl,
        read_recording,
        replay,
    )
    from tuimon.status import format_text, report
    from tuimon.ui.app import TuimonApp
    from tuimon.ui.node_screen import NodeScreen
    from tuimon.ui.replay_app import ReplayApp

    frames = _frames(seed=22, count=120)

    async def hostile(ws: web.WebSocketResponse) -> None:
        while True:
            for data in frames:
                await ws.send_bytes(data)
                await asyncio.sleep(0.02)

    from agent.sim.fake_nvml import FakeNvml
    from tests.conftest import serve

    honest = make_agent(proc_root, FakeNvml(2), interval=0.2)
    writer = RecordingWriter(str(tmp_path / "rec.tmr"), "fuzz")
    try:
        async with serve(honest) as server, _agents([hostile]) as (hostile_target,):
            honest_target = f"{server.host}:{server.port}"
            config = RelayConfig(listen="127.0.0.1:0", ledger=None, interval=0.1,
                                 targets=[honest_target, hostile_target])
            async with Relay(config) as relay:
                relay_target = f"127.0.0.1:{relay.port}"
                cluster = ClusterState("fuzz")
                options = StreamOptions(min_backoff=0.1, max_backoff=0.3, overview=True,
                                        recorder=writer.write)
                app = TuimonApp(cluster, sources=lambda state: [])
                async with watching([], cluster, options, relays=[relay_target]), \
                        app.run_test(size=(120, 40)) as pilot:
                    seen_reasons: set[str] = set()
                    deadline = time.monotonic() + 12
                    while time.monotonic() < deadline:
                        await pilot.pause(0.2)
                        for n in cluster.nodes.values():
                            if n.reason:
                                seen_reasons.add(n.reason)
                        host = next((n for n in cluster.nodes.values()
                                     if n.target == hostile_target), None)
                        if host is not None and not isinstance(app.screen, NodeScreen):
                            app.push_screen(NodeScreen(cluster, host))
                        await pilot.press("tab")  # both maps
                        findings = app.diagnosis.findings
                        format_text(report(cluster, app.efficiency, findings, "ok"))
                        render(cluster)
                    assert app.is_running
                    # Never, not only at the end: a part that failed once and then ran
                    # again would clear its error.
                    assert app.ui_guard.failures == 0, app.ui_guard.errors
                    assert app.diagnosis.guard.failures == 0, app.diagnosis.guard.errors
                    if isinstance(app.screen, NodeScreen):
                        assert app.screen.guard.failures == 0, app.screen.guard.errors
                    assert not any("internal error" in r for r in seen_reasons)
                    assert not any("internal error" in e.message for e in cluster.events)
                    honest_node = cluster.nodes[honest_target]
                    assert honest_node.status == "up", honest_node.reason
                    assert any("bad frame" in r for r in seen_reasons), seen_reasons
    finally:
        writer.close()

    rec = read_recording(str(tmp_path / "rec.tmr"))
    assert rec.duration > 5
    control = ReplayControl(speed=50.0)
    cluster = ClusterState("replay")
    replay_app = ReplayApp(cluster, control, rec.duration,
                           sources=lambda state: [replay(rec, state, control)])
    async with replay_app.run_test(size=(100, 30)) as pilot:
        for _ in range(10):
            await pilot.pause(0.2)
        assert replay_app.ui_guard.failures == 0 and replay_app.diagnosis.guard.failures == 0
        assert any(n.status == "up" for n in cluster.nodes.values())
