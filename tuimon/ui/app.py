"""TuimonApp: the main screen (heatmaps, storage, events) over a ClusterState.

Sources run as asyncio tasks on the app's loop and only update the model; a timer
redraws what changed once a second. Key bindings have ids (`tuimon.<id>`) so users can
remap them in Textual's keymap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Vertical
from textual.filter import LineFilter
from textual.screen import Screen
from textual.widgets import Footer

from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Finding
from tuimon.model.guard import Guard
from tuimon.model.judge_config import JudgeConfig
from tuimon.model.judgement import Judgement, JudgePace, marked_nodes
from tuimon.model.map_kinds import FABRIC_MAP, GPU_MAP
from tuimon.model.view_state import ViewState
from tuimon.text.markup import safe
from tuimon.ui.ascii_screen import AsciiScreen, locale_is_ascii
from tuimon.ui.filter_screen import FilterScreen
from tuimon.ui.fleet_screen import FleetScreen
from tuimon.ui.hangup import HANGUP_EXIT, HangupWatch
from tuimon.ui.heatmap import HeatmapView
from tuimon.ui.help_screen import HelpScreen
from tuimon.ui.history_screen import History, HistoryScreen
from tuimon.ui.job_screen import JobScreen
from tuimon.ui.node_screen import NodeScreen
from tuimon.ui.palette import palette_commands
from tuimon.ui.panels import (
    DiagnosisPane,
    EventsPane,
    HeaderBar,
    Legend,
    SloStrip,
    StoragePanel,
)
from tuimon.ui.terminal_size import trust_the_terminal
from tuimon.ui.theme_files import DEFAULT_THEME, heat_variable_defaults, load_themes
from tuimon_core import heap
from tuimon_core.hostlist import collect_hostlist, expand_hostlist
from tuimon_core.logs import current_log_path
from tuimon_core.node_states import UP

log = logging.getLogger(__name__)

DRAW_EVERY_S = 0.5  # map lines of nodes with new samples, between the 1 Hz judgements
# Keys that act on the map: not while another screen (a node, the help) is up.
MAP_ACTIONS = frozenset({"switch_map", "sort", "reverse_sort", "filter", "clear_filter",
                         "next_job", "focus_diagnosis", "fleet"})


class TuimonApp(App[None]):
    TITLE = "tuimon"
    CSS = """
    Screen { layout: vertical; }
    /* The map as tall as its rows (up to half the screen, heatmap.MAP_SHARE, and no
       more than the panes below leave: HeatmapView.row_budget), the diagnosis the
       rest: no blank map rows above a clipped list of findings. */
    #maps { height: auto; }
    .hidden { display: none; }
    /* NO_COLOR: no colour at all is sent, so what colour marked is marked by style. */
    HeatmapView:nocolor > .heatmap--cursor { text-style: bold reverse; }
    OptionList:nocolor > .option-list--option-highlighted { text-style: bold reverse; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit", id="quit"),
        Binding("question_mark", "help", "help", id="help"),
        Binding("slash", "filter", "filter", id="filter"),
        Binding("s", "sort", "sort", id="sort"),
        Binding("S", "reverse_sort", "reverse", show=False, id="reverse_sort"),
        Binding("t", "next_theme", "theme", id="theme"),
        Binding("tab", "switch_map", "GPU/fabric", id="switch_map", priority=True),
        Binding("J", "next_job", "next job", id="next_job"),
        Binding("b", "job", "job", id="job"),
        Binding("f", "focus_diagnosis", "findings", id="focus_diagnosis"),
        Binding("i", "fleet", "fleet", id="fleet"),
        Binding("H", "history", "history", id="history"),
        Binding("H", "no_history", "history", show=False, id="no_history"),
        Binding("escape", "clear_filter", "clear filter", show=False, id="clear_filter"),
        Binding("colon", "go_to", "go to", show=False, id="go_to"),
    ]

    def _findings(self) -> list[Finding]:
        """What the diagnosis holds now (the node screen's held findings)."""
        return self.diagnosis.findings

    def get_line_filters(self) -> Sequence[LineFilter]:
        filters = super().get_line_filters()
        return [*filters, self._ascii_screen] if self.ascii_only else filters

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "no_history":  # `H` then says where the history is kept
            return self.history is None
        # The node screen and the help sit above the map: its keys must not move it.
        return self.offers(action) and not (action in MAP_ACTIONS and len(self.screen_stack) > 1)

    def offers(self, action: str) -> bool:
        """Whether this app can do `action` at all, whatever screen is up."""
        if action == "history":
            return self.history is not None  # only a ledger keeps them
        return action != "no_history"  # a note for a key, not a command to offer

    def __init__(self, cluster: ClusterState, *,
                 sources: Callable[[ClusterState], list[Coroutine[Any, Any, None]]] | None = None,
                 theme: str | None = None, judgement: Judgement | None = None,
                 refresh: float = 1.0, clock_text: Callable[[], str] | None = None,
                 ascii_only: bool | None = None, notes: list[str] | None = None,
                 history: History | None = None) -> None:
        """`judgement`: the cluster's, as the model builds it (JudgeConfig.judgement: its
        topology, provisioned throughput, SLO, baselines, CPU nodes and clock); none
        given, one with none of them."""
        # NO_COLOR (no-color.org): no colour at all. Textual's own answer sends its
        # colours as 256-colour greys unless the colours are the terminal's (ANSI): so
        # the terminal's, which its NO_COLOR filter then drops altogether.
        super().__init__(ansi_color=True if os.environ.get("NO_COLOR") is not None else None)
        self.clock_text = clock_text
        # ASCII only (--ascii, or a locale that cannot show UTF-8): every glyph mapped at
        # the last step (tuimon.ui.ascii_screen).
        self.ascii_only = locale_is_ascii(os.environ) if ascii_only is None else ascii_only
        self._ascii_screen = AsciiScreen()
        # What the command line took but warned about: said on the screen too.
        self._notes = list(notes or [])
        self.cluster = cluster
        # The relays' incidents (the history screen), where the app watches relays.
        self.history = history
        self._make_sources = sources
        self._tasks: list[asyncio.Task[None]] = []
        self.cluster_watch = (judgement if judgement is not None
                              else JudgeConfig().judgement(cluster))
        self.storage = self.cluster_watch.storage
        self.efficiency = self.cluster_watch.efficiency
        self.diagnosis = self.cluster_watch.diagnosis
        self.view = ViewState(topology=dict(self.diagnosis.topology),
                              cpu_nodes=self.diagnosis.cpu_nodes)
        self.job_index = 0
        # Panes and maps that failed (a bug): shown, logged, and the rest goes on.
        self.ui_guard = Guard()
        self._told_errors: set[str] = set()
        self.refresh_every = refresh
        # The judgement (ages, aggregates, diagnosis) reads every node: beyond a few
        # thousand it runs less often than the map is drawn, so that the loop stays free
        # for samples and keys (the model's pace).
        self.pace = JudgePace(quiet=self.quiet_judging)
        self._ticked_at = -math.inf
        self._hangup = HangupWatch(headless=True)  # the terminal, once there is one
        self._wanted_theme = theme or DEFAULT_THEME
        themes, self.theme_problems = load_themes()
        self.theme_names = [t.name for t in themes]
        for t in themes:
            self.register_theme(t)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("headless"):  # a headless run is given its size
            trust_the_terminal()  # its terminal's size, not an exported COLUMNS and LINES
        return super().run(*args, **kwargs)

    # -- layout --------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield SloStrip(id="slo")
        yield Legend(id="legend")
        with Vertical(id="maps"):
            yield HeatmapView(self.cluster, self.view, GPU_MAP, id="gpu-map")
            yield HeatmapView(self.cluster, self.view, FABRIC_MAP, id="fabric-map",
                              classes="hidden")
        yield StoragePanel(id="storage")
        yield DiagnosisPane(id="diagnosis")
        yield EventsPane(id="events")
        yield Footer()

    @property
    def active_map(self) -> HeatmapView:
        gpu = self.query_one("#gpu-map", HeatmapView)
        return self.query_one("#fabric-map", HeatmapView) if gpu.has_class("hidden") else gpu

    async def on_mount(self) -> None:
        if self._wanted_theme in self.theme_names:
            self.theme = self._wanted_theme
        else:
            self.notify(f"unknown theme {self._wanted_theme!r}; themes: "
                        f"{', '.join(self.theme_names)}", severity="warning", markup=False)
            self.theme = DEFAULT_THEME
        for problem in [*self.theme_problems, *self._notes]:
            self.notify(problem, severity="warning", timeout=10, markup=False)
        if self._make_sources is not None:
            self._tasks = [asyncio.create_task(s) for s in self._make_sources(self.cluster)]
        self.active_map.focus()
        self._hangup = HangupWatch(self.is_headless)
        self._tell_drawn()
        self._layout_seen = -1
        self._rows_elsewhere = -1  # what rows_elsewhere() said at the last fit
        self.tick()
        self.set_interval(self.refresh_every, self.tick)
        # Samples reach the map between judgements: at the judgement's own pace a node's
        # sample that arrives just after a tick waits a second, and one superseded before
        # the next is never drawn. Only the changed lines are redrawn.
        self.set_interval(min(self.refresh_every, DRAW_EVERY_S), self.draw)
        # A source that reads the whole cluster at once (tuimon prom) is drawn as soon as
        # its read is applied, not up to DRAW_EVERY_S later.
        self.cluster.add_read_listener(self._draw_soon)
        # What exists now (widgets, styles, themes) lives as long as the app; samples
        # churn from here on (tuimon_core.heap).
        heap.settle()

    async def on_unmount(self) -> None:
        self.cluster.remove_read_listener(self._draw_soon)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return {**super().get_theme_variable_defaults(), **heat_variable_defaults()}

    # -- refresh -------------------------------------------------------------------------

    def _draw_soon(self) -> None:
        self.call_later(self.draw, True)

    def draw(self, read: bool = False) -> bool:
        """Between ticks: the map lines whose nodes sent something new. Whether it looked
        (not when the tick has just drawn, nor while the layout waits for the tick).
        `read`: a source has just applied a whole read, newer than any tick."""
        if not self.is_running:
            return False  # shutting down: the timers outlive the screen's widgets
        if not read and time.perf_counter() - self._ticked_at < DRAW_EVERY_S / 2:
            return False  # the tick has just drawn what changed (the timers meet each second)
        if self.cluster.layout_version != self._layout_seen or self.view.sort == "metric":
            return False
        self.ui_guard.run("the map", self.active_map.refresh_changed, None)
        return True

    def tick(self) -> None:
        """Once a second: ages, aggregates, and redraw of what changed. Each part runs
        alone (tuimon.model.guard): a bug in one pane is shown and logged, and the map
        and the other panes go on updating."""
        if not self.is_running:
            return  # shutting down: the timers outlive the screen's widgets
        if self._hangup.hung_up():
            log.warning("the terminal hung up: nobody sees this screen any more; ending")
            self.exit(return_code=HANGUP_EXIT)
            return
        start = time.perf_counter()
        guard = self.ui_guard
        version = self.cluster.version
        judged = self.pace.due(start, self.refresh_every, version)
        if judged:
            findings = guard.run("the judgement", self.cluster_watch.update,
                                 self.diagnosis.findings)
            faults = guard.run("the map's fault marks",
                               lambda: marked_nodes(findings, self.view.topology), {})
            for view in self.query(HeatmapView):
                view.faults = faults
            self.pace.judged(start, version, time.perf_counter() - start, self.refresh_every)
        self._ticked_at = time.perf_counter()
        guard.run("the map", self._redraw_maps, None)
        width, compact = self.size.width, self.size.height < 32
        guard.run("the header", lambda: self.query_one(HeaderBar).update_from(
            self.cluster, self.active_map.folded, width,
            self.clock_text() if self.clock_text else None,
            judged_every=self.pace.slowed(self.refresh_every)),
            None)
        guard.run("the legend", self._update_legend, None)
        if judged:
            guard.run("the efficiency strip", lambda: self.query_one(SloStrip).update_from(
                width, self.efficiency, self.job_index), None)
            guard.run("the storage pane", lambda: self.query_one(StoragePanel).update_from(
                self.storage, width, compact), None)
            guard.run("the diagnosis pane", lambda: self.query_one(DiagnosisPane).update_from(
                findings + guard.findings(), width, self.diagnosis.wall()), None)
            guard.run("the map", self._fit_map, None)
        guard.run("the events pane", lambda: self.query_one(EventsPane).update_from(
            self.cluster, width), None)
        self._tell_internal_errors()

    def rows_elsewhere(self) -> int:
        """The rows the panes around the map want: the header, the strip, the legend and
        the footer, the storage pane, the diagnosis's lines (up to its half of the
        screen) and a line of events, with their rules. On a short terminal the map
        gives them this room before it grows (and folds sooner)."""
        storage = self.query_one(StoragePanel).outer_size.height
        strip = max(1, self.query_one(SloStrip).outer_size.height)
        lines = max(DiagnosisPane.MIN_ROWS - 1, 1 + len(self.query_one(DiagnosisPane).groups))
        return 3 + strip + storage + 1 + min(lines, self.size.height // 2) + \
            EventsPane.MIN_ROWS

    def _fit_map(self) -> None:
        """Lay the map out again when what the other panes want changed."""
        wanted = self.rows_elsewhere()
        if wanted != self._rows_elsewhere:
            self._rows_elsewhere = wanted
            for view in self.query(HeatmapView):
                view.relayout()

    def _redraw_maps(self) -> None:
        if self.cluster.layout_version != self._layout_seen or self.view.sort == "metric":
            self._layout_seen = self.cluster.layout_version
            for view in self.query(HeatmapView):
                view.relayout()
        else:
            self.active_map.refresh_changed()

    def _tell_internal_errors(self) -> None:
        """A part that starts failing is said once, on top of its finding."""
        errors = {**self.diagnosis.guard.errors, **self.ui_guard.errors}
        for part in errors.keys() - self._told_errors:
            where = current_log_path()
            self.notify(f"internal error in {part}: {errors[part]} (a bug"
                        + (f"; the traceback is in {where}" if where else "")
                        + "); the rest keeps updating", severity="error", timeout=8,
                        markup=False)
        self._told_errors = set(errors)

    def _update_legend(self) -> None:
        heat = self.active_map
        node = heat.current
        cursor = "no node selected"
        if node is not None:
            cursor = f"[b]{safe(node.name, 30)}[/b] {node.status}"
            if node.status != UP and node.reason:
                age = node.age()
                cursor += f" {age:.0f}s: {safe(node.reason, 60)}" if age else \
                    f": {safe(node.reason, 60)}"
        title = heat.map_kind.title
        extra = []
        if self.view.filter_text:
            shown = len(heat._hm_order)
            extra.append(f"filter /{safe(self.view.filter_text, 30)}/: " + (
                f"{shown} node{'s' if shown != 1 else ''}" if shown else
                "[$warning]no node matches[/] (esc clears it)"))
        order = self.view.order_text(heat.metric.key)
        if order:
            extra.append(order)
        if self.cluster.asking(heat.metric.reads):
            extra.append("[$warning]asking the server for these values[/]")
        self.query_one(Legend).update_from(title, heat.metric, heat.metrics, cursor,
                                           self.size.width, ", ".join(extra))

    # -- actions ---------------------------------------------------------------------------

    def action_switch_map(self) -> None:
        selected = self.active_map.current
        for view in self.query(HeatmapView):
            view.toggle_class("hidden")
        heat = self.active_map
        heat.relayout()
        heat.select(selected)  # the same node on the other map
        heat.focus()
        self._tell_drawn()
        self._update_legend()

    def _tell_drawn(self) -> None:
        """What the map on screen draws of every node: a source that pays for each field
        it asks (tuimon prom) asks for no more, and asks again at once when it changes."""
        self.cluster.set_drawn(self.active_map.metric.reads)

    def action_next_job(self) -> None:
        jobs = sorted(self.efficiency.jobs)
        if len(jobs) <= 1:
            self.notify(f"one job reports steps: {safe(jobs[0], 40)}" if jobs else
                        "no job reports steps", timeout=3)
            return
        self.job_index = (self.job_index + 1) % len(jobs)
        self.query_one(SloStrip).update_from(self.size.width, self.efficiency, self.job_index)
        self.notify(f"job {self.job_index + 1} of {len(jobs)}: "
                    f"{safe(jobs[self.job_index], 40)}", timeout=2)

    def action_sort(self) -> None:
        self.view.sort = "metric" if self.view.sort == "name" else "name"
        self._resort()

    def action_reverse_sort(self) -> None:
        self.view.reverse = not self.view.reverse
        self._resort()

    def _resort(self) -> None:
        for view in self.query(HeatmapView):
            view.relayout()
        self._update_legend()

    def action_job(self) -> None:
        """The screen of the job the strip shows."""
        jobs = sorted(self.efficiency.jobs)
        if not jobs:
            self.notify("no job reports steps: nothing to open", timeout=3)
            return
        job = jobs[self.job_index % len(jobs)]
        self.push_screen(JobScreen(self.efficiency, job, self._findings,
                                   self.diagnosis.wall))

    def show_job_nodes(self, job: str) -> None:
        """The map filtered to the nodes a job's ranks report from."""
        state = self.efficiency.jobs.get(job)
        names = sorted(state.nodes()) if state is not None else []
        if not names:
            self.notify(f"job {safe(job, 40)}: no node reports its steps now", timeout=3)
            return
        self.view.show_names(names, f"job {job}")
        self._resort()
        self.active_map.focus()

    def action_history(self) -> None:
        self.push_screen(HistoryScreen(self.history, self.open_incident))

    def action_no_history(self) -> None:
        self.notify("no history here: a relay's ledger keeps the incidents (watch "
                    "through one: tuimon connect --relay HOST, or status --relay HOST "
                    "--since 6h)", timeout=6)

    def open_incident(self, incident: dict[str, Any]) -> None:
        """What an incident of the history names: its node's screen, the map filtered to
        its leaf or its nodes, or its job."""
        c = incident.get("components") or {}
        nodes = [c["node"]] if c.get("node") else (
            expand_hostlist(c["nodes"]) if c.get("nodes") else [])
        self.open_components(nodes, c.get("leaf"), c.get("job"))

    def action_fleet(self) -> None:
        self.push_screen(FleetScreen(self.cluster, self.view.cpu_nodes))

    def action_filter(self) -> None:
        def apply(value: str | None) -> None:
            if value is None:
                return
            self.view.known_names = frozenset(n.name for n in self.cluster.nodes.values())
            self.view.set_filter(value)
            for view in self.query(HeatmapView):
                view.cursor = 0
                view.relayout()
            self._update_legend()

        self.push_screen(FilterScreen(self.view.filter_text, self.view.topology), apply)

    def action_clear_filter(self) -> None:
        if self.view.filter_text:
            self.view.set_filter("")
            for view in self.query(HeatmapView):
                view.relayout()
            self._update_legend()

    def action_next_theme(self) -> None:
        names = self.theme_names
        i = names.index(self.theme) if self.theme in names else -1
        for step in range(1, len(names) + 1):
            name = names[(i + step) % len(names)]
            try:
                self.theme = name
            except Exception as exc:  # a theme the checks let through: skipped, said
                self.theme_names.remove(name)
                self.notify(f"theme {name} cannot be drawn ({exc}); skipped",
                            severity="warning", markup=False)
                return
            break
        self.notify(f"theme: {self.theme}", timeout=2, markup=False)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if screen is self.screen_stack[0]:  # jumps move the map: from the map's screen only
            yield from palette_commands(self)

    def action_go_to(self) -> None:
        # Its own action: the footer keeps showing ^p for the palette (one key an action).
        self.action_command_palette()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.help_extra))

    help_extra = ""
    # Skip a tick's judgement while nothing new came (the model's JudgePace).
    quiet_judging = True

    def on_resize(self) -> None:
        self.pace.changed()  # the panes are fit to the width when judged: now

    def on_heatmap_view_opened(self, message: HeatmapView.Opened) -> None:
        self.push_screen(NodeScreen(self.cluster, message.node, self._findings,
                                    self.diagnosis.wall))

    def on_heatmap_view_cursor_moved(self, message: HeatmapView.CursorMoved) -> None:
        self._update_legend()

    def action_focus_diagnosis(self) -> None:
        self.query_one(DiagnosisPane).focus()

    def action_focus_map(self) -> None:
        self.active_map.focus()

    def on_diagnosis_pane_picked(self, message: DiagnosisPane.Picked) -> None:
        """Open the node behind a finding; a leaf's finding filters the map to the leaf;
        a group of nodes filters the map to them."""
        g = message.group
        self.open_components(g.nodes, g.leaf, next((f.job for f in g.findings if f.job),
                                                   None))

    def open_components(self, nodes: list[str], leaf: str | None, job: str | None) -> None:
        """What a finding or an incident names, opened: one node's screen; else the map
        filtered to its leaf or its nodes; else its job on the strip and the map."""
        if len(nodes) == 1:
            node = next((n for n in self.cluster.nodes.values() if n.name == nodes[0]), None)
            if node is not None:
                self.active_map.select(node)
                self.push_screen(NodeScreen(self.cluster, node, self._findings,
                                            self.diagnosis.wall))
                return
        if leaf and leaf != "spine":
            self.view.set_filter(leaf)
        elif nodes:
            # The finding's own names, as they are: a name is never read as a pattern.
            self.view.show_names(nodes, collect_hostlist(nodes))
        elif job is not None and job in self.efficiency.jobs:
            # A job's line (a drop, a burn): the strip shows that job, the map its nodes.
            self.job_index = sorted(self.efficiency.jobs).index(job)
            self.query_one(SloStrip).update_from(self.size.width, self.efficiency,
                                                 self.job_index)
            names = sorted(self.efficiency.jobs[job].nodes())
            if names:
                self.view.show_names(names, f"job {job}")
        else:
            return
        self._resort()
        self.active_map.focus()

    def on_heatmap_view_metric_changed(self, message: HeatmapView.MetricChanged) -> None:
        self._tell_drawn()
        self._update_legend()
