"""Incidents: each finding's episode as the relay's judgement held it, kept in its ledger.

An episode is one finding (a kind and its component: `congestion leaf01`, `thermal
gpu042 GPU 3`) from the judgement that raised it to the one that cleared it: its onset
(the condition's start), its end, the gravest severity it reached, the components, the
jobs whose nodes it touched, and the budget those jobs lost while it held that the
ledger put down to it. What an on-call hands over at the end of a shift, and what a
run's report lists.

Bounded whatever a fault (or a hostile peer) does: a finding raised again within MERGE_S
of its end is the same episode again (`flaps` counts how often: a flapping link makes
one episode, not thousands); at most MAX_OPEN held at once, MAX_OPEN_PER_NODE of one
node, MAX_NEW_PER_MINUTE begun a minute (the rest counted in `skipped` and said in the
log), and MAX_EPISODES kept (the oldest go first), besides the ledger's retention.
Information (severity `info`) is no incident.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from tuimon.model.attribution import cause_name
from tuimon_core.findings import SEVERITY_ORDER, Finding
from tuimon_core.hostlist import collect_hostlist
from tuimon_core.protocol.fields import MAX_CAUSE, MAX_FINDING_TEXT

log = logging.getLogger(__name__)

MERGE_S = 600.0  # raised again this soon after it ended: the same episode
MAX_OPEN = 4096
MAX_OPEN_PER_NODE = 64  # held at once for one node: more is a peer making names up
MAX_NEW_PER_MINUTE = 600  # new episodes a minute, the whole relay
MAX_EPISODES = 100_000
MAX_JOBS = 64  # jobs named per episode

SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,            -- the finding as a cause: `congestion leaf01`
    kind TEXT NOT NULL,
    severity TEXT NOT NULL,       -- the gravest it reached
    onset REAL NOT NULL,          -- when its condition began (the relay's clock)
    ended REAL,                   -- when it cleared; NULL while it holds
    components TEXT NOT NULL,     -- JSON: node, gpu, port, leaf, fs, job, nodes, target
    message TEXT NOT NULL,        -- what it said last
    jobs TEXT NOT NULL,           -- JSON: the jobs whose nodes it touched
    lost_s REAL NOT NULL DEFAULT 0,  -- run seconds those jobs lost put down to it
    flaps INTEGER NOT NULL DEFAULT 0  -- times it came back within MERGE_S, merged
);
CREATE INDEX IF NOT EXISTS episodes_by_onset ON episodes (onset);
CREATE INDEX IF NOT EXISTS episodes_by_key ON episodes (key, ended);
"""
UPSERT = """
INSERT INTO episodes (id, key, kind, severity, onset, ended, components, message, jobs,
                      lost_s, flaps)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET severity = excluded.severity, ended = excluded.ended,
    components = excluded.components, message = excluded.message, jobs = excluded.jobs,
    lost_s = excluded.lost_s, flaps = excluded.flaps
"""
_COMPONENT_FIELDS = ("node", "gpu", "port", "leaf", "fs", "job", "target")


@dataclass
class Episode:
    id: int
    key: str
    kind: str
    severity: str
    onset: float
    ended: float | None
    components: dict[str, Any]
    message: str
    jobs: list[str] = field(default_factory=list)
    lost_s: float = 0.0
    flaps: int = 0

    def row(self) -> tuple[Any, ...]:
        return (self.id, self.key, self.kind, self.severity, self.onset, self.ended,
                json.dumps(self.components), self.message, json.dumps(self.jobs),
                self.lost_s, self.flaps)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "severity": self.severity,
                "onset": self.onset, "ended": self.ended, "where": self.where,
                "message": self.message, "components": self.components,
                "jobs": self.jobs, "lost_h": self.lost_s / 3600, "flaps": self.flaps}

    @property
    def where(self) -> str:
        return self.key[len(self.kind):].strip() or self.kind


def _components(f: Finding) -> dict[str, Any]:
    out: dict[str, Any] = {k: getattr(f, k) for k in _COMPONENT_FIELDS
                           if getattr(f, k) is not None}
    if f.nodes:
        out["nodes"] = collect_hostlist(f.nodes)
    return out


def _graver(a: str, b: str) -> str:
    return a if SEVERITY_ORDER.get(a, 3) <= SEVERITY_ORDER.get(b, 3) else b


class Episodes:
    """The episodes held now and those closed recently, in memory; written by the
    ledger's flush (`dirty`), read back from its file."""

    def __init__(self, next_id: int = 1) -> None:
        self.open: dict[str, Episode] = {}
        self.recent: dict[str, Episode] = {}  # closed within MERGE_S, by key
        self.dirty: dict[int, Episode] = {}
        self._next_id = next_id
        self.merged = 0  # raisings merged into an episode that had just ended
        self.skipped = 0  # new episodes not begun: a bound was reached
        self._per_node: dict[str, int] = {}  # node -> its open episodes
        self._minute = (-1, 0)  # (the minute, episodes begun in it)

    def observe(self, findings: list[Finding], now: float,
                jobs_of: Any = None) -> None:
        """The findings the judgement holds at `now`: episodes begin, go on, and end.
        `jobs_of(finding)`: the jobs whose nodes it touches."""
        for key in [k for k, e in self.recent.items() if now - (e.ended or now) > MERGE_S]:
            del self.recent[key]
        held: set[str] = set()
        for f in findings:
            if f.severity == "info":
                continue
            key = cause_name(f)[:MAX_CAUSE]
            if key in held:
                continue
            held.add(key)
            episode = self.open.get(key)
            if episode is None:
                episode = self._begin(key, f, now)
                if episode is None:
                    continue
            episode.severity = _graver(episode.severity, f.severity)
            episode.message = f.message[:MAX_FINDING_TEXT]
            episode.components = _components(f)
            if jobs_of is not None:
                for job in jobs_of(f):
                    if job not in episode.jobs and len(episode.jobs) < MAX_JOBS:
                        episode.jobs.append(job)
            self.dirty[episode.id] = episode
        for key in [k for k in self.open if k not in held]:
            episode = self.open.pop(key)
            self._count(episode, -1)
            episode.ended = now
            self.recent[key] = episode
            self.dirty[episode.id] = episode
        while len(self.recent) > MAX_OPEN:  # the longest ended first
            del self.recent[next(iter(self.recent))]

    def _begin(self, key: str, f: Finding, now: float) -> Episode | None:
        """The episode of a finding newly held: the one it had just ended, again, or a
        new one; None where a bound says no (counted)."""
        node = f.node or ""
        minute = int(now // 60)
        begun = self._minute[1] if self._minute[0] == minute else 0
        if len(self.open) >= MAX_OPEN or self._per_node.get(node, 0) >= MAX_OPEN_PER_NODE \
                or (key not in self.recent and begun >= MAX_NEW_PER_MINUTE):
            if not self.skipped % 1000:
                log.warning("incidents: a bound was reached (%d open, %d of %s, %d begun "
                            "this minute); %d not kept so far", len(self.open),
                            self._per_node.get(node, 0), node or "the cluster", begun,
                            self.skipped + 1)
            self.skipped += 1
            return None
        again = self.recent.pop(key, None)
        if again is not None:  # back within MERGE_S: the same episode, once more
            again.ended = None
            again.flaps += 1
            self.merged += 1
            episode = again
        else:
            onset = f.first_seen if f.first_seen is not None and f.first_seen <= now else now
            episode = Episode(self._next_id, key, f.kind, f.severity, onset, None,
                              _components(f), f.message[:MAX_FINDING_TEXT])
            self._next_id += 1
            self._minute = (minute, begun + 1)
        self.open[key] = episode
        self._count(episode, 1)
        return episode

    def _count(self, episode: Episode, step: int) -> None:
        node = episode.components.get("node") or ""
        held = self._per_node.get(node, 0) + step
        if held > 0:
            self._per_node[node] = held
        else:
            self._per_node.pop(node, None)

    def add_lost(self, cause: str, seconds: float) -> None:
        """Run seconds a job lost, put down to `cause` (a finding as a cause) while it
        held: its episode's cost."""
        episode = self.open.get(cause) or self.recent.get(cause)
        if episode is not None and seconds > 0:
            episode.lost_s += seconds
            self.dirty[episode.id] = episode

    def resume(self, rows: list[Episode]) -> None:
        """The episodes the file has open: a relay restarted goes on with them (what
        still holds continues; what no longer does ends at its first judgement)."""
        for episode in rows:
            if episode.ended is None and len(self.open) < MAX_OPEN:
                self.open[episode.key] = episode
                self._count(episode, 1)


def read(row: tuple[Any, ...]) -> Episode | None:
    """An episode from the file, or None for a row that does not read (damaged)."""
    try:
        (id_, key, kind, severity, onset, ended, components, message, jobs, lost_s,
         flaps) = row
        return Episode(int(id_), str(key), str(kind), str(severity), float(onset),
                       None if ended is None else float(ended), dict(json.loads(components)),
                       str(message), [str(j) for j in json.loads(jobs)][:MAX_JOBS],
                       float(lost_s), int(flaps))
    except (TypeError, ValueError):
        return None
