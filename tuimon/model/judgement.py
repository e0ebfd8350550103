"""The once-a-second judgement every front end makes (the app, `tuimon status`): ages,
storage aggregates, efficiency windows, then the diagnosis over all of them, in that
order, so each sees what the one before it computed this second."""

from __future__ import annotations

from dataclasses import dataclass

from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.storage import StorageView
from tuimon_core.findings import Finding


@dataclass
class Judgement:
    cluster: ClusterState
    storage: StorageView
    efficiency: EfficiencyView
    diagnosis: Diagnosis

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
        guard.end()
        self.diagnosis.findings = findings + guard.findings()
        return self.diagnosis.findings
