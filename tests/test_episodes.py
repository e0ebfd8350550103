"""The relay's incidents (tuimon/relay/episodes.py) in its ledger: each finding's episode
from onset to end, its gravest severity, the jobs it touched and the budget they lost to
it; bounded whatever a fault does; kept across restarts and a kill."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tuimon.relay.episodes import MAX_OPEN, MERGE_S, Episodes
from tuimon.relay.ledger import SCHEMA_VERSION, Ledger
from tuimon_core.findings import Finding

T0 = 1_800_000_000.0
LEAF = Finding("warning", "congestion", "congestion concentrated under leaf01: ...",
               leaf="leaf01", nodes=("gpu001", "gpu002"), score=1.0, first_seen=T0 - 30)


def test_an_episode_runs_from_the_true_onset_to_its_end_and_keeps_its_gravest() -> None:
    book = Episodes()
    book.observe([LEAF], T0, lambda f: ["llm"])
    worse = Finding("critical", "congestion", "worse", leaf="leaf01", nodes=LEAF.nodes,
                    score=1.0, first_seen=T0 - 30)
    book.observe([worse], T0 + 10)
    book.add_lost("congestion leaf01", 90.0)
    book.observe([], T0 + 20)
    [e] = book.dirty.values()
    assert (e.onset, e.ended, e.severity, e.message, e.jobs, e.lost_s) == (
        T0 - 30, T0 + 20, "critical", "worse", ["llm"], 90.0)
    assert e.components["nodes"] == "gpu[001-002]" and e.where == "leaf01"


def test_a_flapping_finding_is_one_episode_and_information_is_none() -> None:
    """Raised and cleared every minute for an hour: one episode that came back 59 times;
    an info finding makes no incident; past MAX_OPEN at once, the rest wait."""
    book = Episodes()
    flap = Finding("warning", "flapping", "gpu003 mlx5_0:1 link went down 2 times",
                   node="gpu003", port="mlx5_0:1")
    for minute in range(60):
        book.observe([flap], T0 + 60 * minute)
        book.observe([], T0 + 60 * minute + 30)
    [e] = {e.id: e for e in book.dirty.values()}.values()
    assert e.flaps == 59 and book.merged == 59
    book.observe([flap], T0 + 60 * 60 + 30 + MERGE_S + 1)  # long after: a new one
    assert len({e.id for e in book.dirty.values()}) == 2
    book = Episodes()
    book.observe([Finding("info", "no_topology", "x")], T0)
    assert not book.dirty


def test_a_peer_making_findings_up_cannot_grow_the_incidents_without_end() -> None:
    """A node naming a new port in every finding, a thousand a second: at most
    MAX_OPEN_PER_NODE of it held; a cluster of such nodes begins at most
    MAX_NEW_PER_MINUTE a minute and holds at most MAX_OPEN; what was not kept is
    counted."""
    from tuimon.relay.episodes import MAX_NEW_PER_MINUTE, MAX_OPEN_PER_NODE

    book = Episodes()
    for second in range(5):
        book.observe([Finding("warning", "symbol_errors", "x", node="evil",
                              port=f"p{second}-{i}") for i in range(1000)], T0 + second)
    assert len(book.open) == MAX_OPEN_PER_NODE and book.skipped > 0
    book = Episodes()
    for minute in range(10):
        book.observe([Finding("warning", "thermal", f"n{i}", node=f"n{i}")
                      for i in range(MAX_OPEN + 5)], T0 + 60 * minute)
        assert len(book.open) <= min(MAX_OPEN, MAX_NEW_PER_MINUTE * (minute + 1))
    assert len(book.open) == MAX_OPEN and len(book.recent) <= MAX_OPEN


def test_the_ledger_keeps_incidents_across_a_restart_and_loses_none_written(
        tmp_path: Path) -> None:
    """Written at the flush; a relay started again goes on with the one still open (it
    ends when the judgement no longer holds it) and lists both, newest first, with the
    budget the job lost to each; of a job, only those that touched it."""
    path = tmp_path / "l.db"
    clock = [T0]
    ledger = Ledger(path, clock=lambda: clock[0])
    thermal = Finding("warning", "thermal", "gpu009 GPU 1 thermal throttling", node="gpu009",
                      gpu=1, score=0.4, first_seen=T0 - 5)
    ledger.observe([LEAF], T0, lambda f: ["llm"])
    clock[0] += 60
    ledger.add("llm", clock[0], 60.0, 30.0, {"comm": 30.0})
    ledger.attribute(lambda job: [LEAF])
    ledger.observe([LEAF, thermal], clock[0], lambda f: ["other"] if f is thermal else ["llm"])
    assert ledger.flush()
    ledger.close()  # (a kill -9 after the flush loses nothing written: the same file)
    clock[0] += 60
    again = Ledger(path, clock=lambda: clock[0])
    again.observe([thermal], clock[0])  # the leaf is over
    incidents = again.incidents(T0 - 3600)
    assert [(e.kind, e.ended) for e in incidents] == [("thermal", None),
                                                      ("congestion", clock[0])]
    assert incidents[1].lost_s == pytest.approx(30.0)
    assert [e.kind for e in again.incidents(T0 - 3600, job="llm")] == ["congestion"]
    again.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT COUNT(*) FROM episodes").fetchone()[0] == 2
