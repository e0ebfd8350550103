"""A run's report as Markdown, for a ticket: the sections of tuimon.ui.report_parts, the
plots as text in fenced blocks (a ticket shows no inline SVG). No Textual.

Names come from the network and the step socket: each is cleaned (no control character,
no newline) and every character Markdown or the HTML it passes through would read as
syntax is escaped, so a job named `<script>` or `a|b` is text in its cell, never a tag or
a column."""

from __future__ import annotations

import re

from tuimon.model.run_report import RunReport
from tuimon.text.burn_plot import burn_plot
from tuimon.text.sparkline import SPARKS
from tuimon.ui.report_parts import Table, sections, when_text
from tuimon_core.protocol.text import clean

WIDTH = 100  # columns of the text plots
# Markdown's and inline HTML's syntax characters: escaped with a backslash, which
# CommonMark takes for any ASCII punctuation.
_SYNTAX = re.compile(r"([\\`*_{}\[\]<>|&#~!])")


def md_text(text: str) -> str:
    """Text from anywhere as Markdown text: cleaned, its syntax escaped."""
    return _SYNTAX.sub(r"\\\1", clean(text))


def _table(t: Table) -> list[str]:
    rule = ["---:" if i in t.right else "---" for i in range(len(t.header))]
    return ["| " + " | ".join(md_text(h) for h in t.header) + " |",
            "| " + " | ".join(rule) + " |",
            *("| " + " | ".join(md_text(cell) for cell in row) + " |" for row in t.rows)]


def sli_lines(r: RunReport, width: int = WIDTH) -> list[str]:
    """The SLI by period as one line of eighth blocks from 0 to 1 (a blank where the job
    did not run), periods merged (weighted by their run time) to fit `width`."""
    points = r.sli
    cols = max(1, min(len(points), width - 6))
    cells = []
    for c in range(cols):
        chunk = points[c * len(points) // cols:(c + 1) * len(points) // cols]
        hours = sum(p.hours for p in chunk if p.sli is not None)
        if hours <= 0:
            cells.append(" ")
            continue
        sli = sum(p.sli * p.hours for p in chunk if p.sli is not None) / hours
        cells.append(SPARKS[min(7, int(sli * 7.999))])
    first, last = when_text(points[0].at), when_text(r.until)
    ends = (first + last.rjust(cols - len(first)) if cols >= 2 * len(first) + 2
            else f"{first} to {last}")
    return ["1.00 \u2502" + "".join(cells), "0.00 \u2514" + "\u2500" * cols, "      " + ends]


def report_markdown(r: RunReport) -> str:
    """The whole report as one Markdown document."""
    lines = [f"# Run report: {md_text(r.job)}", ""]
    for s in sections(r):
        lines += [f"## {md_text(s.title)}", ""]
        for paragraph in s.text:
            lines += [md_text(paragraph), ""]
        if s.plot == "sli" and r.sli:
            lines += ["```text", *sli_lines(r), "```", ""]
        elif s.plot == "burn" and r.burn_down is not None:
            lines += ["Budget left over the run:", "", "```text",
                      *burn_plot(r.burn_down, WIDTH, plain=True), "```", ""]
        if s.table is not None:
            lines += [*_table(s.table), ""]
    return "\n".join(lines)
