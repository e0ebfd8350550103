"""A job's screen (`b`): its numbers, what its budget was spent on, what it waits on, how
its ranks spread, its nodes and findings (tuimon.model.job_report decides all of it;
this draws it, again every second)."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.binding import Binding

from tuimon.model.efficiency import EfficiencyView
from tuimon.model.job_report import job_report
from tuimon.text.job_text import job_text
from tuimon.text.markup import safe
from tuimon.ui.text_screen import TextScreen
from tuimon_core.findings import Finding


class JobScreen(TextScreen):
    BINDINGS = [Binding("escape,b,q", "app.pop_screen", "close", id="close_job"),
                Binding("m", "map", "its nodes on the map", id="job_map")]
    MAX_WIDTH = 140
    TEXT_ID = "job-text"

    def __init__(self, efficiency: EfficiencyView, job: str,
                 findings: Callable[[], list[Finding]],
                 now: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.efficiency = efficiency
        self.job = job
        self.findings = findings
        self.now = now  # the judgement's clock: how long each finding has held

    def on_mount(self) -> None:
        self.set_interval(1.0, self.redraw)

    def text(self) -> str:
        try:
            report = job_report(self.efficiency, self.job, self.findings())
        except KeyError:
            return (f"[b]job {safe(self.job, 60)}[/b]: no longer reports steps\n\n"
                    "[$secondary]esc closes[/]")
        return job_text(report, self.app.size.width if self.is_attached else 120,
                        now=self.now()) + (
            "\n\n[$secondary]m: its nodes on the map; esc closes[/]")

    def action_map(self) -> None:
        """Close, with the map showing the job's nodes only (esc on the map clears it)."""
        self.dismiss()
        show = getattr(self.app, "show_job_nodes", None)
        if show is not None:
            show(self.job)
