"""The history screen (`H`): the incidents the relay's judgement held over the last hours,
as a timeline (one row an incident, its bar over the time axis) with what each cost:
the picture an on-call hands over at the end of a shift. Enter opens what an incident
names (its node, the map filtered to its leaf or nodes, its job). The relay keeps them
(tuimon.relay.episodes); `history(seconds)` reads them."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from tuimon.text.incident_text import cost_text, span_text
from tuimon.text.markup import safe
from tuimon.text.severity import severity_style
from tuimon_core.wording import duration_text

History = Callable[[float], Awaitable[list[dict[str, Any]]]]
RANGES = {"1": 6 * 3600.0, "2": 24 * 3600.0, "3": 3 * 86400.0, "4": 7 * 86400.0}
BAR = 36  # cells of the time axis


def bar(onset: float, ended: float | None, start: float, now: float, width: int = BAR) -> str:
    """The incident over the axis [start, now]: `#` where it held, `.` elsewhere; an
    incident shorter than a cell still marks one."""
    span = max(1.0, now - start)
    lo = max(0, min(width - 1, int((onset - start) / span * width)))
    hi = max(lo + 1, min(width, int(((ended if ended is not None else now) - start)
                                     / span * width + 0.999)))
    return "." * lo + "#" * (hi - lo) + "." * (width - hi)


def axis(start: float, now: float, width: int = BAR) -> str:
    """Times under the bars: the start, the middle and now."""
    left = time.strftime("%a %H:%M" if now - start > 86400 else "%H:%M",
                         time.localtime(start))
    mid = time.strftime("%H:%M", time.localtime((start + now) / 2))
    right = "now"
    pad = max(1, (width - len(left) - len(mid) - len(right)) // 2)
    return f"{left}{' ' * pad}{mid}{' ' * pad}{right}"[:width + 4]


class HistoryScreen(ModalScreen[None]):
    BINDINGS: ClassVar = [
        Binding("escape,H,q", "app.pop_screen", "close", id="close_history"),
        *(Binding(key, f"range({seconds})", f"last {duration_text(seconds)}", show=False,
                  id=f"history_range_{key}") for key, seconds in RANGES.items()),
    ]
    DEFAULT_CSS = """
    HistoryScreen { align: center middle; }
    HistoryScreen > Vertical { width: 100%; max-width: 160; height: auto; max-height: 100%;
                               border: round $primary; background: $surface; }
    HistoryScreen #history-head { padding: 0 1; }
    HistoryScreen OptionList { height: auto; max-height: 100%; border: none; }
    """

    def __init__(self, history: History | None,
                 open_incident: Callable[[dict[str, Any]], None],
                 seconds: float = RANGES["2"]) -> None:
        super().__init__()
        self.history = history
        self.open_incident = open_incident
        self.seconds = seconds
        self.incidents: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("", id="history-head")
            yield OptionList(id="history-list")

    def on_mount(self) -> None:
        self.run_worker(self.load(), exclusive=True)

    async def action_range(self, seconds: float) -> None:
        self.seconds = seconds
        await self.load()

    async def load(self) -> None:
        head = self.query_one("#history-head", Static)
        if self.history is None:
            head.update("[b]history[/b]: kept by a relay (`tuimon relay`, with its ledger); "
                        "this view watches none.\n[$secondary]esc closes[/]")
            return
        head.update(f"[b]history[/b], last {duration_text(self.seconds)}: reading...")
        try:
            self.incidents = await self.history(self.seconds)
        except Exception as exc:  # the relay's answer, or its absence: said, not fatal
            head.update(f"[b]history[/b]: {safe(str(exc), 200)}\n[$secondary]esc closes[/]")
            return
        self.draw()

    def draw(self) -> None:
        now = time.time()
        start = now - self.seconds
        head = self.query_one("#history-head", Static)
        count = len(self.incidents)
        head.update(f"[b]history[/b], last {duration_text(self.seconds)}: {count} "
                    f"incident{'s' if count != 1 else ''}, newest first; enter opens what "
                    f"one names; 1-4: 6 h, 24 h, 3 d, 7 d; esc closes\n"
                    f"{safe(axis(start, now), BAR + 4)}")
        options = self.query_one("#history-list", OptionList)
        options.clear_options()
        for i, incident in enumerate(self.incidents):
            severity = incident["severity"]
            colour = severity_style(severity)
            cost = cost_text(incident)
            line = (f"[{colour}]{bar(incident['onset'], incident['ended'], start, now)}[/] "
                    f"[{colour}]{severity:<8}[/] "
                    f"{safe(incident['kind'].replace('_', ' ') + ' ' + incident['where'], 60)}"
                    f"  {span_text(incident['onset'], incident['ended'], now)}"
                    + (f"  {safe(cost, 60)}" if cost else ""))
            options.add_option(Option(line, id=str(i)))
        if not self.incidents:
            options.add_option(Option("no incident: the relay's judgement held nothing "
                                      "worse than information", disabled=True))

    def on_option_list_option_selected(self, message: OptionList.OptionSelected) -> None:
        if message.option.id is None:
            return
        incident = self.incidents[int(message.option.id)]
        self.dismiss()
        self.open_incident(incident)
