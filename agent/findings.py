"""The node's own findings, judged where its data is.

The shared node-local rules (tuimon_core.node_rules: GPUs failed or throttling, XIDs,
ECC, row remapping, links down or flapping, port errors, NFS latency, step reports)
run over each sample the agent takes, through a `FindingBook` for the hold and the
hysteresis, exactly as the viewer runs them. The active findings go to `/metrics` as
`tuimon_finding`, so Prometheus and Alertmanager can page on what tuimon diagnoses on a
node whether or not anyone has the app open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuimon_core.findings import Finding, FindingBook
from tuimon_core.node_rules import NodeRules


class NodeFindings:
    """The rules' windows for this node and the findings they hold now."""

    def __init__(self, node: str, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._rules = NodeRules(node)
        self._book = FindingBook()
        self.active: list[Finding] = []

    def observe(self, hello: Any, sample: Any) -> list[Finding]:
        """Judge a new sample; returns the conditions that hold in it, each with how long
        it has held here (what the sample's `findings` family carries: readers hold and
        clear them with their own book, counting the hold from when this node first saw
        it, so one who connects now sees a fault that is already there). `active` is
        then what this agent's own book holds, for `/metrics`."""
        now = self._clock()
        self._rules.observe(hello, sample, now)
        conditions = self._rules.conditions(now)
        self.active = self._book.update(conditions, now)
        return self._book.held(conditions, now)
