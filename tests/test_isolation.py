"""One broken or hostile peer never takes down a viewer: a wrong type in one field is
that node's refusal, named; outside strings reach the screen as text, never as markup;
a bug in one part of the app or `status` is shown and logged while the rest goes on.

Every case runs the real way: fake agents on loopback behind a real relay, the app
headless (Textual's run_test), `tuimon status` against the same relay, and a replay of
what the viewer recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent.sim.fake_nvml import FakeNvml
from tests.conftest import make_agent, serve
from tests.test_hostile import fake_agents
from tuimon.model.cluster import ClusterState
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon_core.protocol import Subscribe, encode_map
from tuimon_core.protocol.overview_layout import OVERVIEW_FORM

MARKUP_NODE = "[reverse][b]PWNED"
MARKUP_FS = "[@click=app.quit]Q"
PORT = {"id": "mlx5_0:1", "device": "mlx5_0", "port": 1, "rate": 5e10}


def _hello(node: str = MARKUP_NODE, ports: list[Any] | None = None) -> dict[str, Any]:
    return {"v": 1, "t": "hello", "node": node, "agent_version": "x", "interval": 0.1,
            "ts": time.time(), "families": ["gpu", "storage", "steps", "events", "overview",
                                            "findings", "fabric"],
            "inventory": {"gpus": [{"index": 0, "name": "[/]"}],
                          "ports": [PORT] if ports is None else ports}}


def _sample(seq: int, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "gpus": [{"util": 0.5, "temp": 60.0, "processes": [
            {"pid": 7, "user": "[/]", "command": "[b]train[/b] [@click=app.quit]x"}]}],
        "storage": {"filesystems": [{"id": MARKUP_FS, "fstype": "[/]",
                                     "read_bytes_s": 1e6}],
                    "disks": [{"id": "nvme0n1", "kind": "[/]"}]},
        "fabric": {"ports": [{"id": "mlx5_0:1", "state": 4, "state_name": "[/]",
                              "errors_inc": {"[/]": 3}, "saturated": ["[/b]"]}]},
        "overview": {"fs_rows": [["/lustre", "[/]", 100, 200, 1.0, 1000, 500]],
                     "wait": [0]},
        "steps": {"jobs": [{"id": "[/]", "world": 1, "ranks": [
            {"rank": 0, "steps": 1, "wall": 0.1, "compute": 0.05}]}]},
    }
    base.update(extra)
    return {"v": 1, "t": "sample", "seq": seq, "ts": time.time(), "interval": 0.1, **base}


# A frame per case, each with a field of the wrong type, and the field its refusal names.
WRONG: list[tuple[str, dict[str, Any]]] = [
    ("fs_rows[0].read", _sample(1, overview={"fs_rows": [["/lustre", "lustre", "abc", 0, 0,
                                                          100, 50]]})),
    ("world", _sample(1, steps={"jobs": [{"id": "j", "world": "x", "ranks": []}]})),
    ("ports[0].id", _hello(ports=[{"id": 5, "device": "d"}])),
    ("pid", _sample(1, gpus=[{"processes": [{"pid": "x"}]}])),
    ("fstype", _sample(1, storage={"filesystems": [{"id": "/x"}]})),
    ("severity", {"v": 1, "t": "event", "ts": time.time(), "kind": "xid",
                  "severity": "[/]", "message": "[/] [@click=app.quit]Q"}),
]


def _agent(wrong: dict[str, Any] | None, node: str = MARKUP_NODE) -> Any:
    """A fake agent: its hello and good frames with markup in every name, then (if
    given) one frame with a field of the wrong type, then good frames again."""
    async def behave(ws: web.WebSocketResponse, _: web.Request) -> None:
        await ws.send_bytes(encode_map(_hello(node)))
        for seq in range(1, 100_000):
            await ws.send_bytes(encode_map(_sample(seq)))
            if seq % 10 == 2:
                await ws.send_bytes(encode_map({
                    "v": 1, "t": "event", "ts": time.time(), "kind": "xid",
                    "severity": "critical", "message": "[/] XID on [@click=app.quit]Q"}))
            if seq % 20 == 5 and wrong is not None:
                await ws.send_bytes(encode_map(wrong))
                if wrong["t"] == "hello":
                    await ws.send_bytes(encode_map(_hello(node)))
            await asyncio.sleep(0.05)
    return behave


async def _until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.1)


async def test_a_hostile_node_behind_a_relay_is_refused_field_by_field_never_a_crash(
        proc_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node whose frames carry a string where a number belongs (file system rows, a
    job's world size, a process id), a port id that is a number, a file system without
    its type, an event severity of `[/]`, and markup in every name: through a real relay,
    the app (both maps, the node's screen), `tuimon status` and a replay of the
    recording. Each wrong frame is that node's refusal naming the field; markup is drawn
    as text; the honest node is up throughout; no part of any front end fails."""
    from tuimon.model.judge_config import JudgeConfig
    from tuimon.relay import Relay, RelayConfig
    from tuimon.sources.recording import RecordingWriter, read_recording
    from tuimon.status import run_status
    from tuimon.ui.app import TuimonApp
    from tuimon.ui.node_screen import NodeScreen

    honest = make_agent(proc_root, FakeNvml(2), interval=0.2)
    writer = RecordingWriter(str(tmp_path / "rec.tmr"), "hostile")
    try:
        behaviours = [_agent(None), *(_agent(w, f"case{i}") for i, (_, w) in enumerate(WRONG))]
        async with serve(honest) as server, fake_agents(behaviours) as targets:
            bad_target = targets[0]  # the markup node: every name a markup attack
            ok_target = f"{server.host}:{server.port}"
            config = RelayConfig(listen="127.0.0.1:0", ledger=None, interval=0.1,
                                 targets=[ok_target, *targets])
            async with Relay(config) as relay:
                relay_target = f"127.0.0.1:{relay.port}"
                cluster = ClusterState("isolation")
                # Every value of every node (the node screen's path for all of them).
                options = StreamOptions(min_backoff=0.1, max_backoff=0.3,
                                        recorder=writer.write,
                                        subscribe=Subscribe(overview_form=OVERVIEW_FORM))
                app = TuimonApp(cluster, sources=lambda state: [])
                reasons: set[str] = set()
                async with watching([], cluster, options, relays=[relay_target]), \
                        app.run_test(size=(160, 45)) as pilot:
                    def seen() -> bool:
                        # Each refusal marks the node, named, until its next good frame:
                        # the events keep every one.
                        reasons.update(e.message for e in cluster.events)
                        return all(any(field in r for r in reasons) for field, _ in WRONG)

                    await _until(lambda: bad_target in cluster.nodes and
                                 cluster.nodes[bad_target].hello is not None, "hostile hello")
                    await pilot.pause(2.5)  # two ticks: laid out, judged, drawn
                    main_screen = app.export_screenshot()
                    await pilot.press("tab")
                    app.push_screen(NodeScreen(cluster, cluster.nodes[bad_target]))
                    await pilot.pause(1.0)
                    node_screen = app.export_screenshot()
                    deadline = time.monotonic() + 25
                    while not seen() and time.monotonic() < deadline:
                        await pilot.pause(0.2)
                    assert seen(), [f for f, _ in WRONG if not any(f in r for r in reasons)]
                    assert app.is_running
                    assert app.ui_guard.failures == 0 and app.diagnosis.guard.failures == 0
                    assert isinstance(app.screen, NodeScreen) and app.screen.guard.failures == 0
                    assert not any("internal error" in r for r in reasons), reasons
                    assert cluster.nodes[ok_target].status == "up"
                # The names, as text: no markup applied, no link made, nothing swallowed.
                assert MARKUP_NODE in main_screen
                assert "[/]" in main_screen  # a shared file system's type in the pane
                for text in (MARKUP_NODE, MARKUP_FS, "[b]train[/b]"):
                    assert text in node_screen, text

                code = await run_status([], StreamOptions(), relays=[relay_target], watch=0,
                                        config=JudgeConfig(), as_json=False, name="s")
                out = capsys.readouterr().out
                assert code in (0, 1, 2) and "Traceback" not in out, out
    finally:
        writer.close()

    # What this viewer recorded, and a recording (an older viewer's, or a crafted file)
    # that holds every wrong frame as well: both play to their end.
    crafted = RecordingWriter(str(tmp_path / "crafted.tmr"), "crafted")
    for i, (_, wrong) in enumerate(WRONG):
        crafted.write(f"case{i}:9477", encode_map(_hello(f"case{i}")))
        crafted.write(f"case{i}:9477", encode_map(_sample(1)))
        crafted.write(f"case{i}:9477", encode_map(wrong))
    crafted.close()
    assert read_recording(str(tmp_path / "rec.tmr")).count > 50
    for path in ("rec.tmr", "crafted.tmr"):
        await _replays_to_its_end(tmp_path / path)


async def _replays_to_its_end(path: Path) -> None:
    from tuimon.sources.recording import ReplayControl, read_recording, replay
    from tuimon.ui.replay_app import ReplayApp

    rec = read_recording(str(path))
    control = ReplayControl(speed=20.0)
    replayed = ClusterState("replay")
    replay_app = ReplayApp(replayed, control, rec.duration,
                           sources=lambda state: [replay(rec, state, control)])
    async with replay_app.run_test(size=(120, 40)) as pilot:
        await _until(lambda: control.paused, "the replay's end", timeout=30)
        await pilot.pause(0.3)
        assert replay_app.ui_guard.failures == 0 and replay_app.diagnosis.guard.failures == 0
        assert replay_app.is_running
    if path.name == "crafted.tmr":
        assert replayed.protocol_errors == len(WRONG)


async def test_a_relays_unreadable_budget_is_refused_alone() -> None:
    """A relay whose ledger entry has a string where hours belong: its nodes' frames
    still apply; the budget is refused with the reason, as a finding on the relay."""
    from tuimon.model.diagnosis import Diagnosis
    from tuimon.model.efficiency import EfficiencyView
    from tuimon.model.storage import StorageView
    from tuimon_core.protocol import Batch, encode

    async def bad_relay(ws: web.WebSocketResponse, _: web.Request) -> None:
        frames = [("n1:9477", encode_map(_hello(node="n1"))),
                  ("n1:9477", encode_map(_sample(1)))]
        while True:
            batch = Batch(ts=time.time(), frames=frames, sources=[("n1:9477", "up", None)],
                          budget={"train": {"consumed_h": "x", "window_h": 720.0}})
            await ws.send_bytes(encode(batch))
            frames = [("n1:9477", encode_map(_sample(int(time.time()))))]
            await asyncio.sleep(0.1)

    async with fake_agents([bad_relay]) as (relay_target,):
        cluster = ClusterState()
        async with watching([], cluster, StreamOptions(), relays=[relay_target]):
            await _until(lambda: "n1:9477" in cluster.nodes and
                         cluster.nodes["n1:9477"].sample is not None, "the node's frames")
            await _until(lambda: "budget" in cluster.relay_problems.get(relay_target, {}),
                         "the budget refused")
            assert cluster.nodes["n1:9477"].status == "up"
            assert cluster.budgets == {}
            text = cluster.relay_problems[relay_target]["budget"]
            assert "batch.budget.train.consumed_h" in text, text
            eff = EfficiencyView()
            eff.update(cluster)
            findings = Diagnosis().update(cluster, eff, StorageView())
            assert any(f.kind == "relay_refused" and "consumed_h" in f.message
                       for f in findings)


async def test_a_frame_nested_a_thousand_deep_is_one_nodes_refusal_through_a_relay(
        tmp_path: Path) -> None:
    """A relay forwards what it does not read: a ~1 KB overview nested 995 deep. Before,
    printing it in the refusal raised RecursionError, which dropped the viewer's whole
    connection to the relay, again on every reconnect. It is now that node's refusal;
    the relay's other node stays up, and a replay of the frame plays on."""
    from tests.schema_values import deep_frame
    from tuimon.sources.recording import RecordingWriter
    from tuimon_core.protocol import Batch, encode

    async def relay(ws: web.WebSocketResponse, _: web.Request) -> None:
        seq = 0
        while True:
            seq += 1
            frames = [("ok:9477", encode_map(_sample(seq))), ("bad:9477", deep_frame())]
            if seq == 1:
                frames = [("ok:9477", encode_map(_hello("ok"))),
                          ("bad:9477", encode_map(_hello("bad"))), *frames]
            await ws.send_bytes(encode(Batch(ts=time.time(), frames=frames, sources=[
                ("ok:9477", "up", None), ("bad:9477", "up", None)])))
            await asyncio.sleep(0.1)

    async with fake_agents([relay]) as (target,):
        cluster = ClusterState()
        async with watching([], cluster, StreamOptions(), relays=[target]):
            await _until(lambda: "bad:9477" in cluster.nodes and "sample.overview: expected "
                         "a map" in (cluster.nodes["bad:9477"].reason or ""),
                         "the deep frame refused")
            seq = cluster.nodes["ok:9477"].sample.seq
            await _until(lambda: cluster.nodes["ok:9477"].sample.seq > seq + 5, "ok goes on")
            assert cluster.nodes["ok:9477"].status == "up"
            assert not any("relay" in e.message and "lost" in e.message
                           for e in cluster.events)
    writer = RecordingWriter(str(tmp_path / "deep.tmr"), "deep")
    writer.write("ok:9477", encode_map(_hello("ok")))
    writer.write("bad:9477", deep_frame())
    writer.write("ok:9477", encode_map(_sample(1)))
    writer.close()
    await _replays_to_its_end(tmp_path / "deep.tmr")


def test_step_sums_of_the_smallest_durations_are_judged_and_printed() -> None:
    """5e-324 s of wall time over 2^31 ranks is a valid report whose run time per rank is
    zero: the windows say nothing rather than divide by it (before, `status` ended with
    a ZeroDivisionError and the efficiency rule failed for every job)."""
    from tuimon.model.diagnosis import Diagnosis
    from tuimon.model.efficiency import EfficiencyView
    from tuimon.model.judgement import Judgement
    from tuimon.model.storage import StorageView
    from tuimon.status import format_text, report
    from tuimon_core.protocol import decode

    cluster = ClusterState()
    cluster.apply_message("n:9477", decode(encode_map(_hello("n"))))
    for seq in range(3):
        cluster.apply_message("n:9477", decode(encode_map(_sample(seq, steps={"jobs": [
            {"id": "tiny", "world": 2**31, "ranks": [
                {"rank": 0, "steps": 1, "wall": 5e-324, "compute": 5e-324,
                 "samples": 2**53}]}]}))))
        watch = Judgement(cluster, StorageView(), EfficiencyView(), Diagnosis())
        findings = watch.update()
        format_text(report(cluster, watch.efficiency, findings, "ok"))
    assert watch.diagnosis.guard.failures == 0, watch.diagnosis.guard.errors


async def test_a_bug_in_one_pane_is_shown_and_the_rest_keeps_updating(
        proc_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pane that raises (a bug, made here by breaking the storage pane) is an internal
    error on the screen, logged once with its traceback; the map, the header and the
    other panes go on, and the pane comes back the first time it draws again."""
    from tuimon.ui import panels
    from tuimon.ui.app import TuimonApp

    agent = make_agent(proc_root, FakeNvml(2), interval=0.2)
    broken = {"on": True}
    draw = panels.StoragePanel.update_from

    def flaky(self: Any, *args: Any, **kwargs: Any) -> None:
        if broken["on"]:
            raise ZeroDivisionError("a bug in the storage pane")
        draw(self, *args, **kwargs)

    monkeypatch.setattr(panels.StoragePanel, "update_from", flaky)
    async with serve(agent) as server:
        cluster = ClusterState()
        app = TuimonApp(cluster, sources=lambda state: [])
        async with watching([f"{server.host}:{server.port}"], cluster), \
                app.run_test(size=(160, 40)) as pilot:
            await _until(lambda: any(n.sample for n in cluster.nodes.values()), "a sample")
            await pilot.pause(1.5)
            assert "the storage pane" in app.ui_guard.errors
            pane = app.query_one(panels.DiagnosisPane)
            assert any("internal error in the storage pane" in g.text for g in pane.groups)
            before = cluster.version
            await pilot.pause(1.2)
            assert cluster.version > before and app.is_running  # the rest goes on
            broken["on"] = False
            await pilot.pause(1.5)
            assert app.ui_guard.errors == {}


async def test_status_says_unknown_on_an_internal_error_never_a_traceback(
        proc_root: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A rule that raises makes `status` print the internal error and exit 3 (unknown,
    the check failed), not end with a traceback and 1."""
    from tuimon.model import diagnosis
    from tuimon.model.judge_config import JudgeConfig
    from tuimon.status import run_status

    def broken(self: Any, cluster: Any) -> list[Any]:
        raise KeyError("a bug in the congestion rules")

    monkeypatch.setattr(diagnosis.Diagnosis, "_congestion", broken)
    agent = make_agent(proc_root, FakeNvml(2), interval=0.2)
    async with serve(agent) as server:
        code = await run_status([f"{server.host}:{server.port}"], StreamOptions(), watch=0,
                                config=JudgeConfig(), as_json=False, name="s")
    out = capsys.readouterr().out
    assert code == 3, out
    assert out.startswith("UNKNOWN") and "internal error in the congestion rules" in out


def test_status_exits_unknown_when_the_check_itself_breaks(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever breaks outside the guarded parts: UNKNOWN and 3, the traceback on
    standard error for the report."""
    from tuimon import cli, status

    async def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(status, "run_status", broken)
    code = cli.main(["status", "127.0.0.1:1"])
    captured = capsys.readouterr()
    assert code == 3 and "UNKNOWN: internal error in tuimon status: RuntimeError: boom" in \
        captured.out and "Traceback" in captured.err


def test_json_output_is_json_every_number_finite() -> None:
    """A step of 1e-300 s with many samples makes an infinite rate: `--json` says null
    and why, never `Infinity` (which no strict JSON reader takes)."""
    import json

    from tuimon.model.diagnosis import Diagnosis
    from tuimon.model.efficiency import EfficiencyView
    from tuimon.model.judgement import Judgement
    from tuimon.model.storage import StorageView
    from tuimon.status import report
    from tuimon_core import json_text
    from tuimon_core.protocol import decode

    cluster = ClusterState()
    cluster.apply_message("n:9477", decode(encode_map(_hello("n"))))
    cluster.apply_message("n:9477", decode(encode_map(_sample(1, steps={"jobs": [
        {"id": "tiny", "world": 1, "ranks": [
            {"rank": 0, "steps": 1, "wall": 1e-300, "compute": 1e-300,
             "samples": 2**53}]}]}))))
    watch = Judgement(cluster, StorageView(), EfficiencyView(), Diagnosis())
    text = json_text.dumps(report(cluster, watch.efficiency, watch.update(), "ok"))

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON")

    doc = json.loads(text, parse_constant=refuse)
    assert doc["jobs"]["tiny"]["samples_per_s"] is None
    # Whatever else a report holds, a non-finite number is null and said.
    assert json.loads(json_text.dumps({"a": [1.0, float("inf")], "b": {"c": float("nan")}}),
                      parse_constant=refuse) == {
        "a": [1.0, None], "b": {"c": None}, "not_finite": {"a[1]": "inf", "b.c": "nan"}}
