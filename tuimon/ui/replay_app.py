"""The app over a recording (`tuimon replay`): the main screen with a player's keys."""

from __future__ import annotations

from textual.binding import Binding

from tuimon.model.cluster import ClusterState
from tuimon.model.view_state import ReplayControl
from tuimon.ui.app import TuimonApp

REPLAY_HELP = """

[b]Replay[/b]
  space             pause / play      .    step a second (pauses)
  [ ]               a minute back / ahead   + -  faster / slower"""


class ReplayApp(TuimonApp):
    """The app over a recording, with the keys of a player."""

    # A recording's time runs faster than the wall's: every tick judges.
    quiet_judging = False

    help_extra = REPLAY_HELP

    BINDINGS = [
        Binding("space", "toggle_pause", "pause", id="replay_pause"),
        Binding("full_stop", "step", "step 1 s", id="replay_step"),
        Binding("left_square_bracket", "seek(-60)", "-1 min", id="replay_back"),
        Binding("right_square_bracket", "seek(60)", "+1 min", id="replay_forward"),
        Binding("plus", "speed(2)", "faster", show=False, id="replay_faster"),
        Binding("minus", "speed(0.5)", "slower", show=False, id="replay_slower"),
    ]

    def __init__(self, cluster: ClusterState, control: ReplayControl, duration: float,
                 damage: str | None = None, **kwargs: object) -> None:
        self.control = control
        self.duration = duration
        # Why the recording stops before its file's end (cut short, damaged).
        self.damage = damage
        super().__init__(cluster, clock_text=self._position, **kwargs)  # type: ignore[arg-type]

    async def on_mount(self) -> None:
        if self.damage:
            self.notify(f"the recording {self.damage}", severity="warning", timeout=30,
                        markup=False)

    def _position(self) -> str:
        c = self.control
        state = "paused" if c.paused else f"x{c.speed:g}"
        cut = " [$warning](cut short)[/]" if self.damage else ""
        return f"replay {c.position:6.0f}/{self.duration:.0f} s {state}{cut}"

    def action_toggle_pause(self) -> None:
        self.control.paused = not self.control.paused
        self.tick()

    def action_step(self) -> None:
        self.control.paused = True
        self.control.step_once = True

    def action_seek(self, seconds: float) -> None:
        self.control.seek_to = self.control.position + seconds

    def action_speed(self, factor: float) -> None:
        self.control.speed = max(0.125, min(1000.0, self.control.speed * factor))
        self.tick()
