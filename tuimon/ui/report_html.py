"""A run's report as one self-contained HTML file: the sections of tuimon.ui.report_parts
with the plots as inline SVG (tuimon.ui.report_svg). Nothing outside the file: no script,
no stylesheet, image or font fetched (the reader's own sans-serif), so it opens the same
from a ticket's attachment, offline, years later; every text escaped. Black and grays
only: it prints in grayscale as it reads on screen. No Textual."""

from __future__ import annotations

from tuimon.model.run_report import RunReport
from tuimon.ui.report_parts import Section, Table, sections
from tuimon.ui.report_svg import burn_svg, causes_svg, h, sli_svg

STYLE = """
body { font-family: system-ui, "Segoe UI", "Helvetica Neue", Arial, sans-serif;
       color: #111; background: #fff; max-width: 1100px; margin: 1.5em auto;
       padding: 0 1em; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; border-bottom: 2px solid #111; padding-bottom: 0.1em;
     margin-top: 1.6em; }
table { border-collapse: collapse; width: 100%; font-size: 0.9em; margin: 0.6em 0; }
th, td { border: 1px solid #888; padding: 0.25em 0.5em; text-align: left;
         vertical-align: top; }
th { background: #e6e6e6; }
td.n { text-align: right; white-space: nowrap; }
svg.plot { display: block; max-width: 100%; height: auto; margin: 0.6em 0; }
svg text { font-size: 12px; fill: #111; }
.grid { stroke: #ccc; stroke-width: 1; }
.axis { stroke: #111; stroke-width: 1; }
.line { fill: none; stroke: #000; stroke-width: 2; }
.dot { fill: #000; }
.target { stroke: #555; stroke-width: 1.5; stroke-dasharray: 6 4; }
.even { fill: none; stroke: #666; stroke-width: 1.5; stroke-dasharray: 6 4; }
.bar { fill: #4d4d4d; stroke: #000; stroke-width: 1; }
@media print {
  body { margin: 0; max-width: none; }
  section { break-inside: avoid-page; }
  th { background: #fff; }
}
"""


def _table(t: Table) -> str:
    head = "".join(f"<th>{h(cell)}</th>" for cell in t.header)
    rows = "".join(
        "<tr>" + "".join(f'<td class="n">{h(cell)}</td>' if i in t.right else
                         f"<td>{h(cell)}</td>" for i, cell in enumerate(row)) + "</tr>"
        for row in t.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _plot(r: RunReport, plot: str | None) -> str:
    if plot == "sli" and r.sli:
        return sli_svg(r)
    if plot == "burn" and r.burn_down is not None:
        return burn_svg(r)
    if plot == "causes" and r.causes:
        return causes_svg(r.causes)
    return ""


def _section(r: RunReport, s: Section) -> str:
    return (f"<section><h2>{h(s.title)}</h2>" + "".join(f"<p>{h(p)}</p>" for p in s.text)
            + _plot(r, s.plot) + (_table(s.table) if s.table is not None else "")
            + "</section>")


def report_html(r: RunReport) -> str:
    """The whole report as one HTML document."""
    title = f"Run report: {r.job}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{h(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{h(title)}</h1>\n" + "\n".join(_section(r, s) for s in sections(r))
            + "\n</body></html>\n")
