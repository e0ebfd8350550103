"""A job's screen and `tuimon status --job`: the job's document (tuimon.model.job_report)
as lines, with Textual markup for the screen or plain for a terminal or a log. No Textual
here: `status` imports it."""

from __future__ import annotations

from typing import Any

from tuimon.model.efficiency import WINDOWS
from tuimon.model.slo import coverage_text
from tuimon.text.burn_plot import burn_plot
from tuimon.text.markup import safe
from tuimon.text.severity import severity_style
from tuimon.text.sparkline import SPARKS, sparkline
from tuimon_core.protocol.text import clean
from tuimon_core.wait_kinds import missed_text, said
from tuimon_core.wording import duration_text, held_text, hours_text, plural

BAR = 30  # cells of the longest bar (the kind the most budget went to), 10 when narrow


def _bar(share: float, cells: int) -> str:
    full = round(share * cells)
    return "\u2588" * full + "\u2591" * (cells - full)


def _histogram(bins: list[int], most: int) -> str:
    """A bar a bin; an empty bin blank and any rank at least a step up from it, so one
    straggler among thousands of ranks still shows."""
    return "".join(" " if n == 0 else SPARKS[max(1, min(7, round(n / most * 7)))]
                   for n in bins)


def job_text(r: dict[str, Any], width: int = 120, plain: bool = False,
             now: float | None = None) -> str:
    """The job's document (job_report) as the screen's markup, or as plain text (`tuimon
    status --job`): the same lines either way. `now`: the judgement's clock (Unix time),
    for how long each finding has held (none said without it)."""
    def st(style: str, text: str) -> str:  # a style, where there are styles
        return text if plain else f"[{style}]{text}[/]"

    def b(text: str) -> str:
        return st("b", text)

    def out(text: str, most: int) -> str:  # text from outside: never markup
        return clean(text)[:most] if plain else safe(text, most)

    seen = r.get("sli_covered_s") or {}
    sli = "  ".join(f"{w} {b(f'{v:.2f}')}{coverage_text(seen.get(w), w, WINDOWS[w])}"
                    if v is not None else f"{w} -" for w, v in r["sli"].items())
    ranks = (f"{r['ranks_reporting']} of {r['world']} ranks reporting"
             if r["ranks_reporting"] < r["world"] else plural(r["world"], "rank"))
    lines = [f"{b('job ' + out(r['job'], 60))}  {ranks}  {b(r['verdict'].upper())}",
             f"SLI         {sli}"
             + ("" if plain else f"  {st('$heat-4', sparkline(r['sli_series'], 40, 1.0))}")]
    if r["stopped"] is not None:
        stopped = r["stopped"]
        lines.insert(1, st("$error", f"stopped: no step from any rank for "
                                     f"{duration_text(stopped['for_s'] or 0)}")
                     + f" ({out(stopped['cause'] or 'no finding', 120)}); the time counts "
                       "as `stopped`")
    eff = r["efficiency"]
    rate = f"{r['samples_per_s']:,.0f} samples/s" if r["samples_per_s"] else "- samples/s"
    if eff is None:
        lines.append(f"throughput  {rate}  (no baseline yet: efficiency after 10 minutes)")
    elif eff["against"] == "baseline":
        value = b(f"{eff['value']:.2f}")
        lines.append(f"throughput  {rate}  scaling efficiency {value}")
    else:
        value = b(f"{eff['value']:.2f}")
        lines.append(f"throughput  {rate}  efficiency {value} vs {eff['against']}")
    budget = r["budget"]
    left = b(f"{budget['left_hours']:.1f}")
    lines += [f"budget      {left} of {budget['hours']:.0f} h left "
              f"({budget['scope']}), {hours_text(budget['consumed_hours'])} spent; burn "
              f"{out(budget['burn'], 200)}"]
    if budget.get("recovered_hours"):
        lines.append("            " + st("$secondary", missed_text(
            budget["recovered_hours"], budget.get("recovered_spent_hours"))))
    lines.append("")
    lines.append(b("what the budget was spent on") + (
        "" if r["spent"] else "  nothing yet"))
    top = r["spent"][0]["share"] if r["spent"] else 1.0
    for row in r["spent"]:
        bar = "" if plain else st("$heat-6", _bar(row["share"] / top if top else 0.0,
                                                  BAR if width >= 120 else 10)) + "  "
        lines.append(f"  {row['kind']:<11} {hours_text(row['hours']):>10} {row['share']:>5.0%}  "
                     f"{bar}{st('$secondary', row['what'])}")
        for label, table in (("over the run:", r["run_causes"]),
                             ("while watched:", r["causes"])):
            causes = table.get(row["kind"])
            if causes:
                said_causes = ", ".join(f"{out(c['cause'], 60)} {c['share']:.0%}"
                                        for c in causes)
                lines.append(f"      {st('$secondary', label)} {said_causes}")
    waits = said(r["waiting_1h"]["kinds"])
    lines.append(f"  the last hour: {r['waiting_1h']['share']:.0%} of the step time waiting"
                 + (f" ({waits})" if waits else ""))
    if r["burn_down"] is not None:
        lines += ["", b("budget left over the run")]
        # Never wrapped: narrower than the box it is drawn in (border, padding, scrollbar).
        lines += burn_plot(r["burn_down"], min(width - 6, 100), plain)  # no markup in it
    lines.append("")
    spread = r["ranks"]
    if spread is None:
        lines.append(b("ranks") + "  no compute time per step yet")
    else:
        slow = spread["slowest"]
        gpu = f" GPU {slow['gpu']}" if slow["gpu"] is not None else ""
        lines.append(f"{b('ranks')}  compute per step: median {spread['median_s']:.3f} s, "
                     f"fastest {spread['fastest_s']:.3f} s, slowest {spread['slowest_s']:.3f}"
                     f" s (rank {slow['rank']}, {out(slow['node'], 40)}{gpu})")
        most = max(spread["bins"]) or 1
        bins = (" ".join(str(n) for n in spread["bins"]) if plain else
                st("$heat-4", _histogram(spread["bins"], most)))
        lines.append(f"  fastest {bins} slowest  ({spread['ranks']} ranks in "
                     f"{len(spread['bins'])} bins)")
    for s in r["stragglers"][:5]:
        gpu = f" GPU {s['gpu']}" if s["gpu"] is not None else ""
        lines.append(f"  {st('$warning', 'straggler')} rank {s['rank']} on {out(s['node'], 40)}"
                     f"{gpu}: x{s['ratio']:.2f} the median")
    if len(r["stragglers"]) > 5:
        lines.append(f"  ... and {len(r['stragglers']) - 5} more stragglers")
    lines += ["", f"{b('nodes')}  {len(r['nodes'])}: "
                  f"{out(r['nodes_text'], max(20, width - 20)) or '-'}"]
    lines.append(b("found on them") + ("" if r["findings"] else "  nothing"))
    for f in r["findings"][:10]:
        severity = st(severity_style(f["severity"]), f"{f['severity']:<8}")
        message = clean(f["message"])[:300]
        if now is not None:
            message = held_text(message, f.get("since"), now)
        lines.append(f"  {severity} {out(message, 340)}")  # wrapped, not cut
    return "\n".join(lines)
