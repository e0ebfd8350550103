"""A box of text over the app, closed with esc, scrolling where the terminal is smaller
than the text: the help, the fleet, a job. Each says what it shows and how wide it may
be; the box is drawn the same for all."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class TextScreen(ModalScreen[None]):
    MAX_WIDTH: ClassVar[int] = 120
    TEXT_ID: ClassVar[str] = "screen-text"
    # Type selectors match subclasses too: one rule for every such box.
    DEFAULT_CSS = """
    TextScreen { align: center middle; }
    TextScreen > VerticalScroll { width: 100%; height: auto; max-height: 100%;
                                  border: round $primary; background: $surface; }
    TextScreen Static { padding: 0 1; }
    """

    def text(self) -> str:
        raise NotImplementedError

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.styles.max_width = self.MAX_WIDTH
            yield Static(self.text(), id=self.TEXT_ID)

    def redraw(self) -> None:
        self.query_one(f"#{self.TEXT_ID}", Static).update(self.text())
