"""The relay's run-long account of a job's lost time: what each minute's waiting was put
down to (the findings on the job's nodes), the time a job stood still because its ranks
all fell silent (`stopped`, and why), the hours lost by hour for the burn-down, and a
run's end said by its ranks (`StepReporter.finish`)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agent.reporter import StepReporter
from agent.steps import StepAggregator
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.job_report import job_report
from tuimon.model.slo import Slo
from tuimon.relay.fanout import FanOut
from tuimon.relay.ledger import RETURN_S, STOP_AFTER_S, Ledger
from tuimon.text.job_text import job_text
from tuimon_core.findings import Finding
from tuimon_core.findings_family import findings_to_wire
from tuimon_core.protocol import Hello, Sample, decode, encode
from tuimon_core.wording import onset_text

T0 = 1_800_000_000.0
CONGESTION = Finding("warning", "congestion", "n1 mlx5_0:1: congestion", node="n1",
                     port="mlx5_0:1", score=0.9)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _steps(job: str, rank: int, world: int, wall: float, compute: float,
           waits: dict[str, float] | None = None, ended: int = 0) -> dict:
    r = {"rank": rank, "steps": 1, "wall": wall, "compute": compute, "samples": 8}
    if waits:
        r["waits"] = waits
    entry = {"id": job, "world": world, "ranks": [r] if wall else []}
    if ended:
        entry["ended"] = ended
    return {"jobs": [entry], "received": 1, "rejected": 0}


def _sample(seq: int, steps: dict | None, findings: list[Finding] = ()) -> Sample:
    extra: dict = {"findings": findings_to_wire(list(findings))}
    if steps is not None:
        extra["steps"] = steps
    return Sample(seq=seq, ts=T0 + seq, interval=1.0, gpus=None, host={}, extra=extra)


def _relay(tmp_path: Path) -> tuple[FanOut, Ledger, Clock, Clock]:
    wall, mono = Clock(T0), Clock(1000.0)
    ledger = Ledger(tmp_path / "l.db", clock=wall, monotonic=mono)
    fan = FanOut(on_steps=ledger.add, on_totals=ledger.add_totals, on_ended=ledger.ended,
                 clock=mono, wall=wall)
    for node in ("n1", "n2"):
        hello = Hello(node=node, agent_version="t", boot_id=None, interval=1.0, ts=T0)
        fan.apply_message(f"{node}:9477", hello, encode(hello))
    return fan, ledger, wall, mono


def _tick(fan: FanOut, ledger: Ledger, wall: Clock, mono: Clock, seconds: float = 1.0) -> None:
    """A second of the relay's housekeeping, as its periodic task runs it."""
    wall.t += seconds
    mono.t += seconds
    fan.refresh()
    ledger.attribute(fan.job_findings)
    ledger.note_stops(wall.t, fan.stop_cause, fan.returned)


def _feed(fan: FanOut, target: str, seq: int, steps: dict | None,
          findings: list[Finding] = ()) -> None:
    message = _sample(seq, steps, findings)
    fan.apply_message(target, decode(encode(message)), encode(message))


def test_each_minutes_waiting_goes_to_the_findings_on_the_jobs_nodes(tmp_path: Path) -> None:
    """Two ranks on two nodes wait in collectives; one node's port is congested (its
    agent's own finding): the comm goes to that port, on both ranks' account, and the
    data waiting, which no finding explains, to `no finding`."""
    fan, ledger, wall, mono = _relay(tmp_path)
    for seq in range(1, 121):
        _feed(fan, "n1:9477", seq, _steps("job", 0, 2, 1.0, 0.6, {"comm": 0.3, "data": 0.1}),
              [CONGESTION] if seq > 30 else [])
        _feed(fan, "n2:9477", seq, _steps("job", 1, 2, 1.0, 0.6, {"comm": 0.3, "data": 0.1}))
        _tick(fan, ledger, wall, mono)
    assert ledger.flush()
    causes = ledger.summary(wall.t)["job"]["causes_h"]
    # Before the port's finding held, nothing explained the comm.
    comm = causes["comm"]
    assert set(comm) == {"congestion n1 mlx5_0:1", "no finding"}
    assert comm["congestion n1 mlx5_0:1"] > comm["no finding"] > 0
    assert sum(comm.values()) == pytest.approx(120 * 0.3 / 3600, rel=0.02)
    assert causes["data"] == {"no finding": pytest.approx(120 * 0.1 / 3600, rel=0.02)}
    # Kept across a restart, from the file.
    ledger.close()
    with Ledger(tmp_path / "l.db", clock=wall) as again:
        assert again.summary(wall.t)["job"]["causes_h"]["comm"] == pytest.approx(comm)


def test_a_job_whose_ranks_fall_silent_loses_that_time_as_stopped(tmp_path: Path) -> None:
    """Node n1's agent is lost and the job's ranks stop: from the last report the time
    counts as `stopped`, put down to the lost node, while it lasts (the budget burns on
    screen) and for good once the job reports again."""
    fan, ledger, wall, mono = _relay(tmp_path)
    seq = 0
    for seq in range(1, 61):
        _feed(fan, "n1:9477", seq, _steps("job", 0, 2, 1.0, 0.9))
        _feed(fan, "n2:9477", seq, _steps("job", 1, 2, 1.0, 0.9))
        _tick(fan, ledger, wall, mono)
    last = wall.t
    fan.mark_stale("n1:9477", "connection refused")  # as n1's stream says it
    for _ in range(600):  # ten minutes: n1 is gone, n2's agent is up with no steps
        _feed(fan, "n2:9477", seq, None)
        _tick(fan, ledger, wall, mono)
    s = ledger.summary(wall.t)["job"]
    assert s["stopped_since"] == pytest.approx(last - 1.0, abs=1.0)
    assert s["stopped_cause"] == "node lost n1"
    assert s["spent_h"]["stopped"] == pytest.approx(600 / 3600, abs=2 / 3600)
    assert s["causes_h"]["stopped"] == {"node lost n1": pytest.approx(600 / 3600, abs=2 / 3600)}
    assert s["error_ratio"]["5m"] == pytest.approx(1.0)
    # Back: the silence is written into its minutes, less what the first reports credit.
    for _ in range(int(RETURN_S) + 2):
        seq += 1
        _feed(fan, "n1:9477", seq, _steps("job", 0, 2, 1.0, 0.9))
        _feed(fan, "n2:9477", seq, _steps("job", 1, 2, 1.0, 0.9))
        _tick(fan, ledger, wall, mono)
    assert ledger.flush()
    ledger.close()
    with Ledger(tmp_path / "l.db", clock=wall) as again:
        s = again.summary(wall.t)["job"]
        assert "stopped_since" not in s
        assert s["spent_h"]["stopped"] == pytest.approx(600 / 3600, abs=3 / 3600)
        assert s["causes_h"]["stopped"] == {"node lost n1": s["spent_h"]["stopped"]}
        assert sum(s["spent_h"].values()) == pytest.approx(s["consumed_h"])


def test_a_stop_seen_by_a_relay_that_was_restarted_counts_what_each_relay_saw(
        tmp_path: Path) -> None:
    wall = Clock(T0)
    ledger = Ledger(tmp_path / "l.db", clock=wall)
    ledger.add("job", wall.t, 1.0, 1.0)
    wall.t += STOP_AFTER_S + 1
    ledger.note_stops(wall.t, lambda job: "xid gpu7 GPU 3")
    wall.t += 300
    ledger.flush()  # the relay writes the open stop, then dies
    ledger.close()
    wall.t += 1000  # nobody watched this
    with Ledger(tmp_path / "l.db", clock=wall) as again:
        wall.t += 200
        s = again.summary(wall.t)["job"]
        assert s["stopped_cause"] == "xid gpu7 GPU 3"
        seen = STOP_AFTER_S + 1 + 300 + 200
        assert s["spent_h"]["stopped"] == pytest.approx(seen / 3600, abs=2 / 3600)


@pytest.mark.parametrize("with_last_step", [False, True])
def test_a_run_its_ranks_said_was_complete_is_not_stopped(tmp_path: Path,
                                                          with_last_step: bool) -> None:
    """`finish()` right after the last step (the agent sends both in one sample) or on
    its own: the silence after is the run's end. A node that never ran the job cannot
    say it ended."""
    fan, ledger, wall, mono = _relay(tmp_path)
    for seq in range(1, 31):
        _feed(fan, "n1:9477", seq, _steps("job", 0, 1, 1.0, 0.9))
        _feed(fan, "n1:9477", seq, _steps("other", 0, 1, 1.0, 0.9))
        _tick(fan, ledger, wall, mono)
    _feed(fan, "n1:9477", 31, _steps("job", 0, 1, 1.0 if with_last_step else 0.0, 0.9,
                                     ended=1))
    _feed(fan, "n2:9477", 31, _steps("other", 0, 1, 0.0, 0.0, ended=1))  # not its job
    _feed(fan, "n1:9477", 31, _steps("other", 0, 1, 1.0, 0.9))
    for _ in range(300):
        _tick(fan, ledger, wall, mono)
    budget = ledger.summary(wall.t)
    assert "stopped" not in budget["job"]["spent_h"] and "stopped_since" not in budget["job"]
    assert budget["other"]["spent_h"]["stopped"] > 200 / 3600  # a crash: still stopped


def test_a_job_whose_nodes_come_back_one_by_one_after_running_on_is_not_stopped(
        tmp_path: Path) -> None:
    """Both agents unreachable for ten minutes while the job ran on: it looks stopped
    until they are back, and what their totals show ran is not counted as stopped, the
    second node back twenty seconds after the first."""
    fan, ledger, wall, mono = _relay(tmp_path)
    totals = {"n1": 0.0, "n2": 0.0}

    def report(node: str, seq: int, rank: int) -> None:
        totals[node] += 1.0
        steps = _steps("job", rank, 2, 1.0, 0.9)
        steps["jobs"][0]["total"] = {"steps": int(totals[node]), "wall": totals[node],
                                     "compute": totals[node] * 0.9, "since": T0}
        _feed(fan, f"{node}:9477", seq, steps)

    seq = 0
    for seq in range(1, 61):
        report("n1", seq, 0)
        report("n2", seq, 1)
        _tick(fan, ledger, wall, mono)
    for node in ("n1", "n2"):
        fan.mark_stale(f"{node}:9477", "connection refused")
    for _ in range(600):
        totals["n1"] += 1.0  # the ranks run on; nobody hears them
        totals["n2"] += 1.0
        _tick(fan, ledger, wall, mono)
    assert ledger.summary(wall.t)["job"]["stopped_since"]  # as far as the relay knows
    for i in range(40):
        seq += 1
        report("n1", seq, 0)
        if i >= 20:
            report("n2", seq, 1)
        else:
            totals["n2"] += 1.0
        _tick(fan, ledger, wall, mono)
    assert ledger.flush()
    s = ledger.summary(wall.t)["job"]
    assert "stopped_since" not in s
    assert s.get("spent_h", {}).get("stopped", 0.0) < 10 / 3600, s["spent_h"]
    assert s["observed_h"] == pytest.approx((60 + 600 + 40) / 3600, abs=5 / 3600)


def test_a_job_with_long_steps_is_not_stopped_between_them(tmp_path: Path) -> None:
    """Steps of 90 s: reports come 90 s apart. The first gap looks like a stop until the
    step that ends it credits the time; after that the job's gaps are learned."""
    wall = Clock(T0)
    ledger = Ledger(tmp_path / "l.db", clock=wall)
    for _ in range(20):
        ledger.add("job", wall.t, 90.0, 80.0)
        for _ in range(90):
            wall.t += 1
            ledger.note_stops(wall.t, lambda job: "no finding")
    ledger.add("job", wall.t, 90.0, 80.0)
    wall.t += RETURN_S + 1
    ledger.note_stops(wall.t, lambda job: "no finding")
    s = ledger.summary(wall.t)["job"]
    assert "stopped" not in s["spent_h"], s["spent_h"]


def test_a_stop_longer_than_the_limit_is_the_jobs_end(tmp_path: Path) -> None:
    wall = Clock(T0)
    ledger = Ledger(tmp_path / "l.db", clock=wall, stopped_most_h=1.0)
    ledger.add("job", wall.t, 1.0, 1.0)
    for _ in range(30):
        wall.t += 60
        ledger.note_stops(wall.t, lambda job: "no finding")
    assert ledger.summary(wall.t)["job"]["stopped_since"] == T0  # half an hour: stopped
    for _ in range(50):
        wall.t += 60
        ledger.note_stops(wall.t, lambda job: "no finding")
    s = ledger.summary(wall.t)["job"]
    assert "stopped" not in s["spent_h"] and "stopped_since" not in s


def test_the_agent_passes_a_ranks_finish_on(tmp_path: Path) -> None:
    """`StepReporter.finish()` through the agent's socket reader to the wire."""
    agg = StepAggregator(interval=1.0)
    path = str(tmp_path / "steps.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    reporter = StepReporter("job", 0, 2, socket_path=path)
    with reporter.step(samples=4):
        pass
    reporter.finish()
    for _ in range(2):
        agg.add(server.recv(4096))
    server.close()
    taken = agg.take()
    assert taken is not None
    entry = taken["jobs"][0]
    assert entry["id"] == "job" and entry["ended"] == 1 and len(entry["ranks"]) == 1
    decode(encode(Sample(seq=1, ts=T0, interval=1.0, gpus=None, host={},
                         extra={"steps": taken})))  # the wire's checks take it
    # A finish for a job this node does not count says nothing.
    agg.add(__import__("msgpack").packb({"v": 1, "t": "end", "job": "other", "rank": 0,
                                         "world": 1}))
    assert agg.take() is None


def test_the_job_screen_shows_the_run_long_causes_the_stop_and_the_burn_down(
        tmp_path: Path) -> None:
    wall = Clock(T0)
    ledger = Ledger(tmp_path / "l.db", clock=wall, window_hours=48)
    start = wall.t
    for hour in range(24):  # a day at SLI 0.9, the comm under a congested port
        ledger.add("job", start + 3600 * hour + 3599, 3600.0, 3240.0, {"comm": 300.0})
    ledger.attribute(lambda job: [CONGESTION])
    wall.t = start + 29 * 3600  # hourly reports: silent for four of their gaps
    ledger.note_stops(wall.t, lambda job: "node lost n1")
    wall.t += 1800
    budget = ledger.summary(wall.t)
    assert len(budget["job"]["lost_h"]) == 30
    assert budget["job"]["lost_h"][0] == pytest.approx(0.1)
    from tuimon.model.cluster import ClusterState

    cluster = ClusterState()
    cluster.apply_budget(budget, "relay")
    eff = EfficiencyView(Slo(0.9, 48), wall=wall)
    eff.update(cluster)
    doc = job_report(eff, "job", [])
    assert doc["verdict"] == "stopped" and doc["stopped"]["cause"] == "node lost n1"
    assert doc["run_causes"]["comm"][0]["cause"] == "congestion n1 mlx5_0:1"
    down = doc["burn_down"]
    assert down["left_hours"][0] == pytest.approx(4.8 - 0.1)
    assert down["left_hours"][-1] < down["even_hours"][-1]  # behind an even burn
    for width, plain in ((200, False), (80, True)):
        text = job_text(doc, width, plain=plain)
        assert "over the run:" in text and "] congestion n1 mlx5_0:1 100%" in text \
            if not plain else "over the run: congestion n1 mlx5_0:1 100%" in text
        assert "stopped: no step from any rank for 5.5 h" in text and \
            "(node lost n1); the time counts as `stopped`" in text
        assert "budget left over the run" in text and "behind an even burn" in text
    plain = job_text(doc, 80, plain=True)
    assert plain.isascii() and max(len(line) for line in plain.splitlines()) <= 100
    # Its findings say since when they hold, on the clock the reader judges by.
    began = wall.t - 300
    held = Finding("critical", "efficiency_drop", "the job's drop", job="job",
                   first_seen=began)
    found = job_report(eff, "job", [held])
    assert found["findings"][0]["since"] == began
    for plain_text in (True, False):
        assert (f"the job's drop; since {onset_text(began, wall.t)}"
                in job_text(found, 200, plain=plain_text, now=wall.t))
    assert "drop; since" not in job_text(found, 200, plain=True)  # no clock given
    plot = plain[plain.index("budget left over the run"):].splitlines()[1:11]
    assert all(len(line) <= 74 for line in plot), plot
    assert any("*" in line for line in plot) and any("." in line for line in plot)
