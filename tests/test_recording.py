"""Recordings: what a viewer received, written as received and replayed the same."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster
from tuimon.model.cluster import ClusterState
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon.sources.recording import (
    RecordingError,
    RecordingWriter,
    ReplayControl,
    read_recording,
    replay,
)


async def _record(path: Path, port: int, seconds: float = 2.5) -> ClusterState:
    sim = SimCluster(nodes=3, gpus=2, base_port=port, interval=0.25, scenario="xid-79",
                     fault_at=0.5)
    writer = RecordingWriter(path, "rec-test")
    live = ClusterState("live")
    async with sim, watching(sim.targets, live, StreamOptions(recorder=writer.write)):
        await asyncio.sleep(seconds)
    writer.close()
    return live


async def test_replay_shows_what_was_recorded(tmp_path: Path, unused_tcp_port_factory) -> None:
    path = tmp_path / "incident.tuimon"
    live = await _record(path, unused_tcp_port_factory())
    rec = read_recording(path)
    assert rec.name == "rec-test" and rec.count > 10 and rec.duration > 1.5 and not rec.damage
    replayed = ClusterState("replay")
    control = ReplayControl(speed=50.0)
    task = asyncio.create_task(replay(rec, replayed, control))
    for _ in range(100):
        await asyncio.sleep(0.05)
        if control.paused:  # reached the end
            break
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert set(replayed.nodes) == set(live.nodes)
    for target, node in live.nodes.items():
        again = replayed.nodes[target]
        assert again.sample.seq == node.sample.seq
        assert again.sample.gpus == node.sample.gpus  # the lost GPU included
    assert any(g.get("failed") for n in replayed.nodes.values() for g in n.gpu_values())


async def test_seek_back_rebuilds_and_step_moves_one_second(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    path = tmp_path / "r.tuimon"
    await _record(path, unused_tcp_port_factory(), seconds=2.0)
    rec = read_recording(path)
    cluster = ClusterState()
    control = ReplayControl(speed=1.0, paused=True)
    task = asyncio.create_task(replay(rec, cluster, control))
    try:
        control.seek_to = rec.duration
        await asyncio.sleep(0.2)
        last = {t: n.sample.seq for t, n in cluster.nodes.items() if n.sample}
        control.seek_to = 0.6
        await asyncio.sleep(0.2)
        early = {t: n.sample.seq for t, n in cluster.nodes.items() if n.sample}
        assert all(early[t] < last[t] for t in early)
        control.step_once = True
        await asyncio.sleep(0.2)
        assert control.position == pytest.approx(1.6)
        assert cluster.gpu_total() > 0
        control.seek_to = 0.0  # before the first frame: nothing yet, header included
        await asyncio.sleep(0.2)
        assert not cluster.nodes and cluster.gpu_total() == 0 and cluster.interval() is None
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_damaged_and_foreign_files_are_refused_or_kept_to_the_damage(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(RecordingError, match="not a tuimon recording"):
        read_recording(other)
    good = tmp_path / "ok.tuimon"
    writer = RecordingWriter(good)
    for i in range(50):
        writer.write("a:1", bytes([i]) * 100)
    writer.close()
    data = gzip.decompress(good.read_bytes())
    cut = tmp_path / "cut.tuimon"
    cut.write_bytes(gzip.compress(data[: len(data) - 150]))  # killed mid-write
    rec = read_recording(cut)
    assert 0 < rec.count < 50 and len(list(rec.frames())) == rec.count
    assert rec.damage is not None and f"stops after {rec.count} frames" in rec.damage
    with pytest.raises(RecordingError, match="cannot write"):
        RecordingWriter(tmp_path / "no" / "such" / "dir.tuimon")


async def test_the_replay_app_plays_pauses_and_seeks(tmp_path: Path,
                                                     unused_tcp_port_factory) -> None:
    from tuimon.ui.replay_app import ReplayApp

    path = tmp_path / "r.tuimon"
    await _record(path, unused_tcp_port_factory(), seconds=2.0)
    rec = read_recording(path)
    control = ReplayControl(speed=1.0)
    cluster = ClusterState("replay")
    app = ReplayApp(cluster, control, rec.duration,
                    sources=lambda state: [replay(rec, state, control)], refresh=0.2)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause(0.5)
        assert "replay" in str(app.query_one("#header").render())
        await pilot.press("space")
        assert control.paused
        await pilot.press("right_square_bracket")
        await pilot.pause(0.3)
        assert control.position == pytest.approx(rec.duration)
        assert cluster.counts()["up"] == 3
        await pilot.press("left_square_bracket")
        await pilot.pause(0.3)
        assert control.position == 0.0
        await pilot.press("plus")
        assert control.speed == 2.0


async def test_a_replay_shows_an_outage_as_it_was_live(tmp_path: Path,
                                                       unused_tcp_port_factory) -> None:
    """Recorded through a relay with a ledger: the relay dies for a while, then comes
    back. The replay shows what the live viewer showed: nodes up, then unknown behind the
    unreachable relay (not frozen at up), then back; the run's budget, as the relay sent
    it. A hostile call in the file is skipped with a reason, the rest plays."""
    from tests.test_relay import _start_relay  # a relay process, kill -9 included
    from tuimon.sources.recording import apply_call, apply_item

    path = tmp_path / "outage.tuimon"
    sim = SimCluster(nodes=3, gpus=1, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    port = unused_tcp_port_factory()
    ledger = tmp_path / "ledger.db"
    writer = RecordingWriter(path, "outage")
    live = ClusterState("live")
    live.recorder = writer.call
    relay_at = f"127.0.0.1:{port}"
    async with sim:
        relay = await _start_relay(sim.targets, port, ledger)
        try:
            async with watching([], live, StreamOptions(recorder=writer.write, min_backoff=0.2,
                                                        max_backoff=0.4), relays=[relay_at]):
                for _ in range(200):
                    await asyncio.sleep(0.05)
                    if live.budgets and sum(n.status == "up" for n in live.nodes.values()) == 3:
                        break
                await asyncio.sleep(1.0)
                relay.kill()
                await relay.wait()
                for _ in range(200):
                    await asyncio.sleep(0.05)
                    if live.lost_relays:
                        break
                await asyncio.sleep(2.0)
                relay = await _start_relay(sim.targets, port, ledger)
                for _ in range(300):
                    await asyncio.sleep(0.05)
                    if not live.lost_relays and all(n.status == "up"
                                                    for n in live.nodes.values()):
                        break
                await asyncio.sleep(1.0)
        finally:
            relay.terminate()
            await relay.wait()
    writer.call("apply_source_state", "x:1", "exploded", None)  # not a state
    writer.close()
    assert not live.lost_relays
    rec = read_recording(path)
    at = [0.0]
    # On the recording's clock, as `tuimon replay` plays it (here a day before it was
    # made, so that the replay's times cannot be taken for now's).
    replayed = ClusterState("replay", wall=lambda: rec.started - 86400 + at[0])
    states: list[tuple[str, ...]] = []
    for t, name, data, call in rec.frames():
        at[0] = t
        apply_item(replayed, name, data, call)
        states.append(tuple(sorted(n.status for n in replayed.nodes.values())))
    seen = [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]
    assert ("up", "up", "up") in seen and ("unknown", "unknown", "unknown") in seen, seen
    unknown_at = seen.index(("unknown", "unknown", "unknown"))
    assert ("up", "up", "up") in seen[unknown_at:], seen  # and back
    assert "x:1" not in replayed.nodes  # the hostile call was skipped
    assert replayed.budgets and "llm-pretrain" in replayed.budgets  # the run's budget
    kinds = [e.kind for e in replayed.events]
    assert kinds.count("relay_lost") == 1 and kinds.count("relay_back") == 1, kinds
    # The outage's events (and the lost relay's onset, the same moment) at the times it
    # happened in the recording, not when it is replayed.
    lost = next(e for e in replayed.events if e.kind == "relay_lost")
    assert rec.started - 86400 < lost.ts <= rec.started - 86400 + rec.duration, \
        (lost.ts, rec.started)
    apply_call(replayed, "mark_stale", b"\xc1")  # not msgpack: skipped, no raise
