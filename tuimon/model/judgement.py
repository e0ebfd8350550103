"""The once-a-second judgement every front end makes (the app, `tuimon status`): ages,
storage aggregates, efficiency windows, then the diagnosis over all of them, in that
order, so each sees what the one before it computed this second. How often a viewer
that ticks judges (`JudgePace`), and which nodes its findings mark (`marked_nodes`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuimon.model.attribution import attribute
from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.storage import StorageView
from tuimon_core.findings import KINDS, Finding

# Findings whose coming and going is already an event of its own (a node lost or back,
# a relay lost or back), or that are not about the cluster (a bug in a part).
_OWN_EVENTS = frozenset(name for name, k in KINDS.items() if k.own_event)


@dataclass
class Judgement:
    cluster: ClusterState
    storage: StorageView
    efficiency: EfficiencyView
    diagnosis: Diagnosis
    # The findings of the last pass, by key: a finding raised or cleared is an event.
    _held: dict[tuple[object, ...], Finding] = field(default_factory=dict)
    # Put the waiting down to the findings at each pass; a one-shot that waits for
    # conditions being held turns it off meanwhile, so its few seconds go to what it
    # found once they showed, not to "no finding" while they were held back.
    attribute_each_pass: bool = True

    def update(self) -> list[Finding]:
        """Call once a second; returns the findings that hold now. A part that fails (a
        bug) is an `internal_error` finding, and the parts after it still run on what
        the one before left (tuimon.model.guard)."""
        guard = self.diagnosis.guard
        guard.begin()
        guard.run("node ages", self.cluster.refresh_ages, None)
        guard.run("storage aggregates", lambda: self.storage.update(self.cluster), None)
        guard.run("efficiency windows", lambda: self.efficiency.update(self.cluster), None)
        findings = guard.run("the diagnosis", lambda: self.diagnosis.update(
            self.cluster, self.efficiency, self.storage), self.diagnosis.findings)
        if self.attribute_each_pass:
            guard.run("what the waiting is put down to",
                      lambda: attribute(self.efficiency, findings), None)
        guard.end()
        self.diagnosis.findings = findings + guard.findings()
        self._events(findings)
        return self.diagnosis.findings

    def _events(self, findings: list[Finding]) -> None:
        """A finding raised, and one cleared, is an event: the events pane and the node
        screen say when a link flapped or a GPU throttled, not only that it does now."""
        held = {f.key: f for f in findings if f.kind not in _OWN_EVENTS}
        when = self.diagnosis.wall()
        for key, f in held.items():
            if key not in self._held:
                self.cluster.finding_event(f, raised=True, ts=when)
        for key, f in self._held.items():
            if key not in held:
                self.cluster.finding_event(f, raised=False, ts=when)
        self._held = held


# A viewer judges on its own tick (the app's, a second), and every tick while that is
# cheap. Beyond, at most this share of wall time goes on the judgement (measured,
# smoothed): at 16,384 nodes a judgement took ~0.4 s, and at one a second it held samples
# back (p95 past 2 s).
JUDGE_SHARE = 0.10
JUDGE_MAX_TICKS = 10
# With nothing new from any node (a source that refreshes every few seconds, such as
# Prometheus), the judgement waits for new data, but never longer than this: holds,
# ages and burn windows move on with time alone.
QUIET_JUDGE_S = 5.0


@dataclass
class JudgePace:
    """When a viewer that ticks every `tick` seconds judges: every tick while judging is
    cheap (it always is below a few thousand nodes); beyond, once in as many whole ticks
    as keep it under JUDGE_SHARE of the time, and never more rarely than JUDGE_MAX_TICKS
    (ages and findings must not go stale after one stall: a swap storm, a stopped
    process). `quiet`: a tick with nothing new since the last judgement is skipped, up to
    QUIET_JUDGE_S (a replay, whose time runs faster than the wall's, judges every tick)."""

    quiet: bool = True
    every: float = 0.0  # seconds between judgements (a tick or less: every tick)
    at: float = -math.inf  # when the last judgement began
    version: int = -1  # the cluster's version the last judgement saw
    cost: float | None = None  # seconds a judgement takes, smoothed

    def due(self, now: float, tick: float, version: int) -> bool:
        """Whether the tick at `now` judges, the cluster at `version`."""
        if self.every > tick and now - self.at < self.every - tick / 2:
            return False
        return not (self.quiet and version == self.version
                    and now - self.at < QUIET_JUDGE_S - tick / 2)

    def judged(self, at: float, version: int, took: float, tick: float) -> None:
        """A judgement began at `at` on the cluster at `version` and took `took` s."""
        self.at, self.version = at, version
        self.cost = took if self.cost is None else 0.7 * self.cost + 0.3 * took
        # Whole ticks (it runs on one), at most JUDGE_MAX_TICKS.
        ticks = min(JUDGE_MAX_TICKS, math.ceil(self.cost / JUDGE_SHARE / tick - 1e-9))
        self.every = tick * max(1, ticks)

    def changed(self) -> None:
        """What a judgement shows changed without news from the nodes (the screen's
        width): the next due tick judges even if nothing new came."""
        self.version = -1

    def slowed(self, tick: float) -> float | None:
        """Seconds between judgements where they are fewer than the ticks, else None."""
        return self.every if self.every > tick else None


def marked_nodes(findings: list[Finding], topology: dict[str, str]) -> dict[str, str]:
    """The nodes the findings mark (on a map), worst severity each: those a finding names,
    else its node, else every node of its leaf (`topology`: node -> leaf switch); a
    finding of severity info marks none."""
    by_leaf: dict[str, list[str]] = {}
    for node, leaf in topology.items():
        by_leaf.setdefault(leaf, []).append(node)
    out: dict[str, str] = {}
    for f in findings:
        if f.severity == "info":
            continue
        names = list(f.nodes) or ([f.node] if f.node else by_leaf.get(f.leaf or "", []))
        for name in names:
            if out.get(name) != "critical":
                out[name] = f.severity
    return out
