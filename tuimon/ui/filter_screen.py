"""The filter's prompt (`/`): a host list, a leaf, text or a regular expression, checked
as typed by the view's own rule before it is taken."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from tuimon.model.view_state import FilterError, ViewState
from tuimon.text.markup import safe


class FilterScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel", id="cancel_filter")]
    DEFAULT_CSS = """
    FilterScreen { align: center top; }
    FilterScreen > Vertical { width: 70; height: auto; margin-top: 3; background: $surface;
                              border: round $primary; padding: 0 1; }
    """

    def __init__(self, current: str, topology: dict[str, str] | None = None) -> None:
        super().__init__()
        self.current = current
        self.topology = topology or {}

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("filter nodes: a host list (gpu[008-015]), a leaf switch, text or "
                         "a regular expression (a node's name, or a Slurm job id, pod, user "
                         "or training job running on it; empty: all)")
            yield Input(value=self.current, id="filter-input")
            yield Static("", id="filter-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            ViewState(topology=self.topology).set_filter(event.value)
        except FilterError as exc:
            self.query_one("#filter-error", Static).update(f"[$error]{safe(str(exc))}[/]")
            return
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
