"""A job's budget burn-down as lines of text: the hours left over the run (`●`) against
an even burn to the end of its window (`·`). Characters, not colour, tell the two lines
apart, so it reads under NO_COLOR and in ASCII (`*` and `.`). No Textual here: `status
--job` prints it too."""

from __future__ import annotations

import time
from typing import Any

HEIGHT = 8  # rows of the plot area


def _when(ts: float, span_s: float) -> str:
    return time.strftime("%m-%d %H:%M" if span_s < 3 * 86400 else "%Y-%m-%d",
                         time.gmtime(ts))


def burn_plot(down: dict[str, Any], width: int, plain: bool = False) -> list[str]:
    """The burn-down (tuimon.model.job_report.burn_down) in `width` columns."""
    left, even = down["left_hours"], down["even_hours"]
    budget = max(down["budget_hours"], 1e-9)
    start, step, since = down["from"], down["every_h"] * 3600, down["since"]
    span = max(step, down["window_end"] - start)
    run = max(1.0, down["window_end"] - since)
    label = 7  # the hours on the axis, `  72.0 `
    cols = max(10, width - label - 2)
    mark, line, bar, corner, rule = (("*", ".", "|", "+", "-") if plain else
                                     ("\u25cf", "\u00b7", "\u2502", "\u2514", "\u2500"))
    grid = [[" "] * cols for _ in range(HEIGHT)]

    def row(hours: float) -> int:
        share = max(0.0, min(1.0, hours / budget))
        return HEIGHT - 1 - round(share * (HEIGHT - 1))

    for c in range(cols):  # the even burn, from the job's start to its window's end
        t = start + (c + 1) / cols * span
        grid[row(budget * min(1.0, max(0.0, 1 - (t - since) / run)))][c] = line
    for i, hours in enumerate(left):  # the hours left, as far as the run has got
        c = min(cols - 1, int((i + 1) * step / span * cols))
        grid[row(hours)][c] = mark
    out = []
    for r, cells in enumerate(grid):
        axis = (f"{budget:>6.1f} " if r == 0 else "   0.0 " if r == HEIGHT - 1
                else " " * label)
        out.append(f"{axis}{bar}{''.join(cells).rstrip()}")
    out.append(" " * label + corner + rule * cols)
    first, last = _when(start, span), _when(start + span, span)
    out.append(" " * (label + 1) + first + last.rjust(max(1, cols - len(first))))
    lag = (f"{even[-1] - left[-1]:.1f} h behind an even burn" if left[-1] < even[-1]
           else f"{left[-1] - even[-1]:.1f} h ahead of an even burn")
    out.append(" " * (label + 1) + f"{mark} hours left, {lag}   {line} even burn to the end")
    return out
