"""A job's budget belongs to its own ranks (docs/security.md, "trust"): one hostile peer,
every frame it sends valid on the wire, cannot spend, freeze or poison another job's
budget, through the relay's ledger or the viewer's own count.

The attacks are those a hostile agent (or a local user on a node where the job does not
run) can make with step sums: per-job totals that claim what a relay missed, a world of
2^31, ranks past the job's world, a thousandfold throughput, `ended` every sample.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.test_hostile import fake_agents
from tuimon.model.cluster import ClusterState
from tuimon.model.efficiency import BEST_RISE, EfficiencyView
from tuimon.model.slo import Slo
from tuimon.model.step_credit import StepCredit
from tuimon.relay.fanout import FanOut
from tuimon.relay.ledger import Ledger
from tuimon_core.protocol import Hello, Sample, decode, encode

T0 = 1_800_000_000.0
JOB = "llm"
WORLD = 16  # two honest nodes of eight ranks


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _honest(node: int, seq: int, totals: dict[str, float], ended: bool = False
            ) -> dict[str, Any]:
    """One second of eight ranks of `llm` on honest node `node`, with the node's totals."""
    ranks = [{"rank": node * 8 + r, "steps": 1, "wall": 1.0, "compute": 0.8, "samples": 4,
              "waits": {"comm": 0.2}} for r in range(8)]
    totals["wall"] += 8.0
    totals["compute"] += 6.4
    entry: dict[str, Any] = {"id": JOB, "world": WORLD, "ranks": ranks, "total": {
        "steps": seq * 8, "wall": totals["wall"], "compute": totals["compute"],
        "since": T0 - 10}}
    if ended:
        entry["ended"] = 8
    return {"jobs": [entry], "received": seq * 8, "rejected": 0}


def _hostile(seq: int) -> dict[str, Any]:
    """Everything one node that runs none of `llm` can say about it, every sample: the
    recovery path (totals with a new `since`, a wall of 1e18, world 1, 4096 rank
    entries), a world of 2^31 with no rank, a free rank past the world with a
    thousandfold throughput and no compute, and the run's end; and a job of its own,
    which it may lie about."""
    return {"jobs": [
        {"id": JOB, "world": 1, "ranks": [
            {"rank": r, "steps": 1, "wall": 1.0, "compute": 0.0} for r in range(4096)],
         "total": {"steps": seq, "wall": 1e18, "compute": 0.0, "since": T0 + seq}},
        {"id": JOB, "world": 1 << 31, "ranks": []},
        {"id": JOB, "world": 1 << 31, "ranks": [
            {"rank": WORLD, "steps": 1, "wall": 1.0, "compute": 0.0, "samples": 1 << 50}],
         "ended": 1},
        {"id": "evil", "world": 1 << 31, "ranks": [
            {"rank": 0, "steps": 1, "wall": 1.0, "compute": 0.0, "samples": 1 << 50}],
         "total": {"steps": seq, "wall": 1e18, "compute": 0.0, "since": T0 + seq},
         "ended": 1},
    ], "received": seq, "rejected": 0}


def _feed(fan: FanOut, target: str, seq: int, steps: dict[str, Any]) -> None:
    message = Sample(seq=seq, ts=T0 + seq, interval=1.0, gpus=None, host={},
                     extra={"steps": steps})
    raw = encode(message)
    fan.apply_message(target, decode(raw), raw)  # checked on the wire, as received


def _run_relay(path: Path, attacker: bool, minutes: int = 25) -> dict[str, Any]:
    """A relay's fan-out and ledger, driven second by second with their own clocks: two
    honest nodes run `llm` (a minute of the two unreachable in the middle, their time
    recovered from their totals), with or without the hostile node beside them."""
    wall, mono = Clock(T0), Clock(1000.0)
    ledger = Ledger(path, clock=wall, monotonic=mono)
    fan = FanOut(on_steps=ledger.add, on_totals=ledger.add_totals, on_ended=ledger.ended,
                 clock=mono, wall=wall)
    nodes = ["n0:9477", "n1:9477", *(["evil:9477"] if attacker else [])]
    for target in nodes:
        hello = Hello(node=target.split(":")[0], agent_version="t", boot_id=None,
                      interval=1.0, ts=T0)
        fan.apply_message(target, hello, encode(hello))
    totals = [{"wall": 0.0, "compute": 0.0} for _ in range(2)]
    for seq in range(1, minutes * 60 + 1):
        wall.t += 1.0
        mono.t += 1.0
        away = 600 <= seq < 660  # the honest nodes unreachable for a minute
        for node in range(2):
            steps = _honest(node, seq, totals[node])
            if not away:
                _feed(fan, nodes[node], seq, steps)
        if attacker:
            _feed(fan, "evil:9477", seq, _hostile(seq))
        fan.refresh()
        ledger.attribute(fan.job_findings)
        ledger.note_stops(wall.t, fan.stop_cause, fan.returned)
        ledger.flush() if seq % 10 == 0 else None
    ledger.flush()
    summary = ledger.summary(wall.t)
    ledger.close()
    return summary


def _rows(path: Path, job: str) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as db:
        return {table: list(db.execute(f"SELECT * FROM {table} WHERE job = ? ORDER BY 2, 3",
                                       (job,)))
                for table in ("buckets", "waits", "causes")}


def test_no_minute_of_another_jobs_ledger_changes_when_a_hostile_peer_speaks(
        tmp_path: Path) -> None:
    """25 minutes of `llm` counted by a relay, once alone and once beside a node that
    sends every attack every second: the job's minutes, waits and causes in the two
    ledger files are the same rows, and its budget the same figures."""
    alone = _run_relay(tmp_path / "alone.db", attacker=False)
    beside = _run_relay(tmp_path / "beside.db", attacker=True)
    assert _rows(tmp_path / "alone.db", JOB) == _rows(tmp_path / "beside.db", JOB)
    assert beside[JOB] == alone[JOB]
    # The honest run as it is: 25 minutes, the unreachable minute recovered, 20 % lost.
    assert alone[JOB]["observed_h"] * 3600 == pytest.approx(25 * 60, abs=2)
    assert alone[JOB]["consumed_h"] * 3600 == pytest.approx(25 * 60 * 0.2, abs=1)
    assert alone[JOB]["recovered_h"] * 3600 == pytest.approx(60, abs=2)
    assert alone[JOB]["best_per_gpu"] == pytest.approx(4.0)
    assert "stopped_since" not in alone[JOB] and "stopped" not in alone[JOB]["spent_h"]
    # Its own job it may lie about, within the time that passed: no more than a second
    # a second, its best no more than its first window's (it never rises more than
    # BEST_RISE in a window), never a 1e18-second recovery.
    evil = beside["evil"]
    assert evil["observed_h"] * 3600 <= 25 * 60 + 15
    assert "recovered_h" not in evil


def test_a_claim_alone_never_moves_a_jobs_world() -> None:
    """World 2^31 with no rank, or from a node that holds no rank of the job: the job's
    world stays what its ranks said, and its run time is counted over its own ranks."""
    credit = StepCredit()
    honest = {"jobs": [{"id": JOB, "world": 8, "ranks": [
        {"rank": r, "wall": 1.0, "compute": 0.9} for r in range(8)]}]}
    [job] = credit.credit("n0", honest, now=1.0)
    assert (job.world, job.run_ranks, job.total_s) == (8, 8, pytest.approx(1.0))
    assert credit.credit("evil", {"jobs": [{"id": JOB, "world": 1 << 31, "ranks": []}]},
                         now=1.5) == []
    assert credit.credit("evil", {"jobs": [{"id": JOB, "world": 1 << 31, "ranks": [
        {"rank": 8, "wall": 1.0, "compute": 0.0}]}]}, now=1.5) == []
    assert credit.raises_refused == 2 and credit.invalid == 1
    [job] = credit.credit("n0", honest, now=2.0)
    assert (job.world, job.run_ranks, job.total_s) == (8, 8, pytest.approx(1.0))
    # The node that runs the job may grow it (an elastic restart): its launcher's word.
    grown = {"jobs": [{"id": JOB, "world": 16, "ranks": [
        {"rank": r, "wall": 1.0, "compute": 0.9} for r in range(8)]}]}
    [job] = credit.credit("n0", grown, now=3.0)
    assert (job.world, job.run_ranks) == (16, 8)  # eight of sixteen report: their time
    assert job.total_s == pytest.approx(1.0)


def test_a_job_squatted_with_a_huge_world_is_counted_over_the_ranks_that_report() -> None:
    """A node that names a job first, with a world of 2^31 and one rank of its own, can
    say its own rank's time; the job's real ranks still count a second a second, not
    2^-31 of one."""
    credit = StepCredit()
    credit.credit("evil", {"jobs": [{"id": JOB, "world": 1 << 31, "ranks": [
        {"rank": 99, "wall": 1.0, "compute": 0.0}]}]}, now=1.0)
    [job] = credit.credit("n0", {"jobs": [{"id": JOB, "world": 8, "ranks": [
        {"rank": r, "wall": 1.0, "compute": 0.9} for r in range(8)]}]}, now=2.0)
    assert job.run_ranks == 9 and job.total_s == pytest.approx(8 / 9)


def test_recovery_credits_at_most_the_outage_per_rank_known_before() -> None:
    """Totals that grew by a day while the relay heard nothing for 60 s: 60 s for each
    of the node's ranks it knew, less what the node's reports were credited since."""
    credit = StepCredit()
    steps = {"jobs": [{"id": JOB, "world": 2, "ranks": [
        {"rank": r, "wall": 1.0, "compute": 0.5} for r in range(2)]}]}
    credit.credit("n0", steps, now=10.0)
    before = credit.counted("n0", JOB)
    credit.credit("n0", steps, now=70.0)  # 60 s later, one sample's worth reported
    grant = credit.grant(JOB, 70.0)
    assert grant.missed("n0", 86400.0 * 2, 60.0, 2, before) == pytest.approx(2 * 60 - 2)
    # Granted once: the same time cannot be claimed again, by totals or by reports.
    assert grant.missed("n0", 86400.0 * 2, 60.0, 2, before) == 0.0
    # A node that held no rank of the job then is credited nothing for it.
    assert grant.missed("evil", 86400.0, 60.0, 0, 0.0) == 0.0


def test_the_best_rises_a_bounded_step_per_window() -> None:
    """A viewer counting a job whose one rank claims a thousandfold throughput for ten
    minutes: the windows that hold the spike span twenty minutes, and in each ten the
    best rises at most BEST_RISE times: its efficiency reads a quarter, not 1e-3."""
    wall = Clock(T0)
    view = EfficiencyView(Slo(0.90, 720), wall=wall)
    cluster = ClusterState()
    cluster.apply_hello("n0:9477", Hello(node="n0", agent_version="t", boot_id=None,
                                         interval=1.0, ts=T0))
    for second in range(40 * 60):
        wall.t += 1.0
        spike = 20 * 60 <= second < 30 * 60
        cluster.apply_sample("n0:9477", Sample(
            seq=second, ts=wall.t, interval=1.0, gpus=None, host={}, extra={"steps": {
                "jobs": [{"id": JOB, "world": 2, "ranks": [
                    {"rank": r, "steps": 1, "wall": 1.0, "compute": 0.9,
                     "samples": 4000 if spike and r == 1 else 4} for r in range(2)]}]}}))
        view.update(cluster)
    state = view.jobs[JOB]
    assert state.best_per_gpu == pytest.approx(4.0 * BEST_RISE ** 2)


# -- through a real relay and a real viewer ------------------------------------------------


async def hostile_agent(ws: web.WebSocketResponse, job: str, running: asyncio.Event) -> None:
    """A WebSocket peer speaking the protocol as an agent of its own node: once `job`
    runs, every attack on it in every sample, five a second."""
    await ws.send_bytes(encode(Hello(node="evil", agent_version="t", boot_id=None,
                                     interval=0.2, ts=time.time())))
    await running.wait()
    for seq in range(1, 100_000):
        steps = _hostile(seq)
        for entry in steps["jobs"]:
            if entry["id"] == JOB:
                entry["id"] = job
        await ws.send_bytes(encode(Sample(seq=seq, ts=time.time(), interval=0.2, gpus=None,
                                          host={}, extra={"steps": steps})))
        await asyncio.sleep(0.2)


async def test_a_hostile_agent_beside_a_real_job_through_a_real_relay(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    """A simulated cluster's job and one hostile agent, all targets of a real relay with
    its ledger, and a viewer of that relay: the job's world, run time, budget and best
    are the job's own; the hostile agent's recovery is refused, not logged as credited."""
    from agent.sim.cluster import SimCluster
    from tuimon.relay import Relay, RelayConfig
    from tuimon.sources.agent_stream import StreamOptions, watching

    sim = SimCluster(nodes=2, gpus=4, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    job = sim.job.name
    running = asyncio.Event()
    path = tmp_path / "ledger.db"
    async with fake_agents([lambda ws, _: hostile_agent(ws, job, running)]) as [evil], \
            sim, Relay(RelayConfig(targets=[*sim.targets, evil], listen="127.0.0.1:0",
                                   ledger=path, interval=0.2, flush_every=0.5,
                                   upstream_backoff=(0.1, 0.5))) as relay:
        started = time.time()
        credit = relay.state.fanout.credit
        for _ in range(100):
            if credit.run_ranks(job) == 8:
                break
            await asyncio.sleep(0.1)
        running.set()  # the job runs on two nodes; the attacks begin
        viewer = ClusterState()
        view = EfficiencyView(Slo(0.90, 720))
        async with watching([], viewer, StreamOptions(min_backoff=0.1, max_backoff=0.3),
                            relays=[f"127.0.0.1:{relay.port}"]):
            for _ in range(80):
                await asyncio.sleep(0.1)
                view.update(viewer)
            elapsed = time.time() - started
            budget = viewer.budgets[job]
            state = view.jobs[job]
            assert state.world == 8 and state.run_ranks == 8, (state.world,
                                                               state.run_ranks)
            assert state.verdict(time.time()).state == "ok"
        assert credit.raises_refused > 0 and credit.duplicates > 0
    # At most a second of run time a second (plus a new rank's first allowance), never
    # the hours a recovery of 1e18 rank-seconds would write.
    assert budget["observed_h"] * 3600 <= elapsed + 15.0
    assert budget["consumed_h"] * 3600 <= elapsed * 0.5
    assert "recovered_h" not in budget
    assert budget.get("best_per_gpu") is None or budget["best_per_gpu"] < 1e6


async def test_a_local_user_where_the_job_does_not_run_cannot_reach_it(
        proc_root: Path, tmp_path: Path, unused_tcp_port_factory) -> None:
    """An unprivileged user on a node that runs none of the job writes to that node's
    step socket (the owner check passes there: no process of the job owns it): a world
    of 2^20, ranks past the job's, the run's end. A viewer of the job's nodes and that
    node sees the job as its own ranks say it."""
    import msgpack

    from agent.sim.cluster import SimCluster
    from agent.sim.fake_nvml import FakeNvml
    from tests.conftest import make_agent, serve
    from tuimon.sources.agent_stream import StreamOptions, watching

    path = str(tmp_path / "steps.sock")
    agent = make_agent(proc_root, FakeNvml(1), steps_socket=path, node_name="login1")
    sim = SimCluster(nodes=2, gpus=4, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    job = sim.job.name
    import socket
    user = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    async with sim, serve(agent) as server:
        viewer = ClusterState()
        view = EfficiencyView(Slo(0.90, 720))
        target = f"127.0.0.1:{server.port}"
        async with watching([*sim.targets, target], viewer,
                            StreamOptions(min_backoff=0.1, max_backoff=0.3)):
            for _ in range(30):  # the job runs before the user writes
                await asyncio.sleep(0.1)
                view.update(viewer)
            for i in range(60):
                for rank in (8 + i % 4, 1 << 19):
                    user.sendto(msgpack.packb({"v": 1, "t": "step", "job": job,
                                               "rank": rank, "world": 1 << 20, "wall": 30.0,
                                               "compute": 0.0, "samples": 1 << 40,
                                               "seq": i}), path)
                user.sendto(msgpack.packb({"v": 1, "t": "end", "job": job, "rank": 8,
                                           "world": 1 << 20}), path)
                await asyncio.sleep(0.05)
                view.update(viewer)
            assert agent.steps.received > 0  # the node's agent took them and sent them on
            state = view.jobs[job]
            assert (state.world, state.run_ranks) == (8, 8)
            assert state.ranks_reporting(time.time()) == 8
            sli, _ = state.window(60, time.time())
            assert sli is not None and sli > 0.5
            assert view.credit.raises_refused > 0
    user.close()


def test_one_node_cannot_end_the_ranks_of_another(tmp_path: Path) -> None:
    """Node n0 says `ended` with every sample while n1's ranks of the same job run on;
    then the job crashes (every rank silent): its silence counts as stopped. Once every
    node it ran on has said so, the run is complete and its silence is not lost."""
    wall, mono = Clock(T0), Clock(1000.0)
    ledger = Ledger(tmp_path / "l.db", clock=wall, monotonic=mono)
    fan = FanOut(on_steps=ledger.add, on_totals=ledger.add_totals, on_ended=ledger.ended,
                 clock=mono, wall=wall)
    totals = [{"wall": 0.0, "compute": 0.0} for _ in range(2)]

    def tick(feed: Callable[[int], None], seconds: int) -> None:
        for _ in range(seconds):
            wall.t += 1.0
            mono.t += 1.0
            feed(int(wall.t - T0))
            fan.refresh()
            ledger.note_stops(wall.t, fan.stop_cause, fan.returned)

    def both(seq: int, ended: tuple[bool, bool] = (True, False)) -> None:
        for node in range(2):
            _feed(fan, f"n{node}:9477", seq, _honest(node, seq, totals[node], ended[node]))

    tick(both, 120)
    tick(lambda seq: None, 300)  # a crash: nobody reports
    assert ledger.summary(wall.t)[JOB].get("stopped_since"), "n0 alone ended n1's ranks"
    # The job back and done on both nodes: its next silence is the run's end.
    tick(both, 30)
    tick(lambda seq: both(seq, (True, True)), 1)
    tick(lambda seq: None, 300)
    assert "stopped_since" not in ledger.summary(wall.t)[JOB]
    ledger.close()


def test_a_node_rotating_job_names_holds_a_bounded_number_in_the_viewer() -> None:
    """One node names new jobs as fast as its rank cap lets it (a thousand ranks, freed
    after ten silent minutes) for an hour: the viewer keeps at most MAX_JOBS_KEPT jobs,
    the honest job among them."""
    from tuimon.model.efficiency import MAX_JOBS_KEPT

    wall = Clock(T0)
    view = EfficiencyView(Slo(0.90, 720), wall=wall)
    cluster = ClusterState()
    for target in ("n0:9477", "evil:9477"):
        cluster.apply_hello(target, Hello(node=target[:-5], agent_version="t",
                                          boot_id=None, interval=1.0, ts=T0))
    names = 0
    for tick in range(720):  # an hour, a sample every 5 s
        wall.t += 5.0
        jobs = [{"id": f"junk-{names + i}", "world": 1, "ranks": [
            {"rank": 0, "steps": 1, "wall": 1.0, "compute": 1.0}]} for i in range(10)]
        names += 10
        cluster.apply_sample("evil:9477", Sample(seq=tick, ts=wall.t, interval=5.0, gpus=None,
                                                 host={}, extra={"steps": {"jobs": jobs}}))
        cluster.apply_sample("n0:9477", Sample(seq=tick, ts=wall.t, interval=5.0, gpus=None,
                                               host={}, extra={"steps": {"jobs": [
                                                   {"id": JOB, "world": 1, "ranks": [
                                                       {"rank": 0, "steps": 5, "wall": 5.0,
                                                        "compute": 4.0}]}]}}))
        view.update(cluster)
        assert len(view.jobs) <= MAX_JOBS_KEPT + 1
    assert JOB in view.jobs and len(view.jobs) == MAX_JOBS_KEPT
