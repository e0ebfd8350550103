"""The relay's judgement: the viewer's own (tuimon.model: node, cluster, fleet and job
rules, efficiency, storage), run over every node the relay carries, around the clock.

The fan-out hands every frame it takes (checked whole, as a viewer checks it) to a model
of its own (`ClusterState`); once a second the judgement runs over it, with the topology
the relay was given and the run's budget from its ledger. Its findings are what the
relay pages on (`/metrics`), sends its viewers (the batch's `judgement`), puts the run's
lost time down to (the ledger's causes) and keeps as incidents (the ledger's episodes):
judged once, where the cluster is watched all the time, from the true onset, instead of
by each viewer from the moment it connected.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tuimon.model.cluster import ClusterState
from tuimon.model.judge_config import JudgeConfig
from tuimon_core.findings import Finding

# Said while the relay has no topology: what it cannot judge, once, as information.
NO_TOPOLOGY = Finding("info", "no_topology", "this relay has no topology (--topology, a "
                      "config cluster's leaves): congestion by leaf and spine is not judged; "
                      "ports and nodes that stand out are", target="topology")


class RelayJudge:
    """A model of every node the relay carries, and the judgement over it."""

    def __init__(self, config: JudgeConfig, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.cluster = ClusterState("relay", clock=monotonic)
        self.judgement = config.judgement(self.cluster, wall)
        self.wall = wall
        self.findings: list[Finding] = []
        self.judged_at: float | None = None  # wall clock of the last judgement
        self.seconds = 0.0  # what the last judgement took

    def update(self) -> list[Finding]:
        """Judge now (about once a second); returns the findings that hold."""
        started = time.perf_counter()
        findings = self.judgement.update()
        if not self.config.topology:
            findings = [*findings, NO_TOPOLOGY]
        self.findings = findings
        self.judged_at = self.wall()
        self.seconds = time.perf_counter() - started
        return findings

    def apply_budget(self, budget: dict[str, dict[str, Any]]) -> None:
        """The ledger's summary: the jobs' run-long budget and burn, as a viewer of this
        relay reads them (LedgerBurn), so the burn findings judge the whole run."""
        self.cluster.apply_budget(budget, "ledger")
