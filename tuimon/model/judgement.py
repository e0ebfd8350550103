"""The once-a-second judgement every front end makes (the app, `tuimon status`): ages,
storage aggregates, efficiency windows, then the diagnosis over all of them, in that
order, so each sees what the one before it computed this second."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuimon.model.attribution import attribute
from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.storage import StorageView
from tuimon_core.findings import Finding

# Findings whose coming and going is already an event of its own (a node lost or back,
# a relay lost or back), or that are not about the cluster (a bug in a part).
_OWN_EVENTS = frozenset({"node_lost", "relay_lost", "source_lost", "unreached",
                         "internal_error"})


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
