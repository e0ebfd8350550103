"""The run report's plots as inline SVG: the SLI over the run, the budget left against an
even burn, the budget by cause as bars. Drawn for paper as much as for a screen: black and
grays only, the lines told apart by dashes and markers rather than colour, so a page
printed in grayscale reads the same. No script, no link, no font but the reader's own;
every text escaped (tuimon.ui.report_html.h). No Textual."""

from __future__ import annotations

import html

from tuimon.model.run_report import CauseRow, RunReport
from tuimon.ui.report_parts import when_text
from tuimon_core.protocol.text import clean
from tuimon_core.wording import hours_text

WIDTH, HEIGHT = 900, 260
LEFT, RIGHT, TOP, BOTTOM = 60, 20, 24, 40  # the plot area's margins
LABEL = 48  # characters of a cause's name beside its bar (the table has it whole)


def h(text: str) -> str:
    """Text from anywhere as HTML or SVG text: cleaned, then escaped (quotes too)."""
    return html.escape(clean(text), quote=True)


def _svg(plot_id: str, height: int, title: str, body: list[str]) -> str:
    return (f'<svg id="{plot_id}" class="plot" viewBox="0 0 {WIDTH} {height}" '
            f'width="{WIDTH}" height="{height}" role="img" aria-label="{h(title)}">'
            f"<title>{h(title)}</title>{''.join(body)}</svg>")


def _points(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in points)


class _Frame:
    """Data to pixels over the plot area: time across, a value up."""

    def __init__(self, t0: float, t1: float, low: float, high: float) -> None:
        self.t0, self.t1 = t0, max(t1, t0 + 1.0)
        self.low, self.high = low, high if high > low else low + 1.0

    def x(self, t: float) -> float:
        share = (t - self.t0) / (self.t1 - self.t0)
        return LEFT + max(0.0, min(1.0, share)) * (WIDTH - LEFT - RIGHT)

    def y(self, v: float) -> float:
        share = (v - self.low) / (self.high - self.low)
        return HEIGHT - BOTTOM - max(0.0, min(1.0, share)) * (HEIGHT - TOP - BOTTOM)

    def axes(self, ticks: list[tuple[float, str]]) -> list[str]:
        """Gridlines with their values, the time axis with its two ends."""
        out = []
        for value, label in ticks:
            y = self.y(value)
            out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" '
                       f'y2="{y:.1f}"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                       f'text-anchor="end">{h(label)}</text>')
        base = HEIGHT - BOTTOM
        out.append(f'<line class="axis" x1="{LEFT}" y1="{base}" x2="{WIDTH - RIGHT}" '
                   f'y2="{base}"/><line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" '
                   f'y2="{base}"/>')
        out.append(f'<text x="{LEFT}" y="{base + 18}">{h(when_text(self.t0))}</text>'
                   f'<text x="{WIDTH - RIGHT}" y="{base + 18}" text-anchor="end">'
                   f"{h(when_text(self.t1))}</text>")
        return out


def sli_svg(r: RunReport) -> str:
    """The SLI of each period (a dot each, joined where periods follow each other; a gap
    where the job did not run) and the SLO's target, dashed."""
    every = r.sli_every_s
    frame = _Frame(r.sli[0].at, max(r.until, r.sli[-1].at + every), 0.0, 1.0)
    body = frame.axes([(v, f"{v:.2f}") for v in (0.0, 0.25, 0.5, 0.75, 1.0)])
    target = frame.y(r.slo.target)
    body.append(f'<line class="target" x1="{LEFT}" y1="{target:.1f}" x2="{WIDTH - RIGHT}" '
                f'y2="{target:.1f}"/><text x="{WIDTH - RIGHT - 4}" y="{target - 5:.1f}" '
                f'text-anchor="end">target {r.slo.target:.2f}</text>')
    runs: list[list[tuple[float, float]]] = [[]]
    for p in r.sli:
        if p.sli is None:
            runs.append([])
            continue
        xy = (frame.x(p.at + every / 2), frame.y(p.sli))
        runs[-1].append(xy)
        body.append(f'<circle class="dot" cx="{xy[0]:.1f}" cy="{xy[1]:.1f}" r="3"/>')
    body[:0] = [f'<polyline class="line" points="{_points(run)}"/>' for run in runs
                if len(run) > 1]
    return _svg("sli-plot", HEIGHT, f"SLI of {r.job} by period of the run", body)


def burn_svg(r: RunReport) -> str:
    """The budget left at the end of each period (solid, dots) against an even burn from
    the job's start to the end of its window (dashed)."""
    down = r.burn_down
    assert down is not None
    step = down["every_h"] * 3600
    budget = down["budget_hours"]
    # The whole budget at the job's start, then what each period left.
    times = [down["since"], *(min(r.until, down["from"] + (i + 1) * step)
                              for i in range(len(down["left_hours"])))]
    left, even = [budget, *down["left_hours"]], [budget, *down["even_hours"]]
    frame = _Frame(min(times), max(times), min(0.0, *left), budget)
    body = frame.axes([(budget, f"{budget:.1f} h"), (budget / 2, f"{budget / 2:.1f} h"),
                       (0.0, "0 h")])
    evenly = [(frame.x(t), frame.y(v)) for t, v in zip(times, even, strict=True)]
    line = [(frame.x(t), frame.y(v)) for t, v in zip(times, left, strict=True)]
    body.append(f'<polyline class="even" points="{_points(evenly)}"/>'
                f'<polyline class="line" points="{_points(line)}"/>')
    body += [f'<circle class="dot" cx="{x:.1f}" cy="{y:.1f}" r="3"/>' for x, y in line]
    body.append(f'<text x="{LEFT + 8}" y="{TOP - 8}">solid: hours left; dashed: an even '
                f"burn to the end of the window</text>")
    return _svg("burn-plot", HEIGHT, f"Error budget of {r.job} left over the run", body)


def causes_svg(causes: list[CauseRow]) -> str:
    """A bar per cause, the longest the cause the most budget went to."""
    row, label_w = 22, 380
    height = TOP + row * len(causes) + 8
    most = max((c.hours for c in causes), default=0.0) or 1.0
    span = WIDTH - RIGHT - label_w - 90
    body = []
    for i, c in enumerate(causes):
        y = TOP + i * row
        name = f"{c.kind}: {c.cause}"
        name = name if len(name) <= LABEL else name[:LABEL - 1] + "\u2026"
        width = max(1.0, c.hours / most * span)
        body.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end">{h(name)}</text>'
                    f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{width:.1f}" '
                    f'height="{row - 6}"/><text x="{label_w + width + 6:.1f}" y="{y + 15}">'
                    f"{h(hours_text(c.hours))}</text>")
    return _svg("causes-plot", height, "Error budget by cause", body)
