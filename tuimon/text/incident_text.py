"""A relay's incidents as lines for people: `tuimon status --since` prints them and the
app's history screen lists them beside their bars. No Textual: text only."""

from __future__ import annotations

import time
from typing import Any

from tuimon_core.wording import duration_text, hours_text


def span_text(onset: float, ended: float | None, now: float) -> str:
    """`02:13-02:59 (46 min)`, or `since 02:13 (47 min, holds)` while it holds."""
    day = "%a %H:%M" if now - onset > 20 * 3600 else "%H:%M"
    start = time.strftime(day, time.localtime(onset))
    held = duration_text((ended if ended is not None else now) - onset)
    if ended is None:
        return f"since {start} ({held}, holds)"
    return f"{start}-{time.strftime('%H:%M', time.localtime(ended))} ({held})"


def cost_text(incident: dict[str, Any]) -> str:
    """What the incident cost, as the relay's ledger put the jobs' lost time down to it."""
    lost = incident["lost_h"]
    jobs = incident["jobs"]
    if lost <= 0:
        return f"touched {', '.join(jobs)}" if jobs else ""
    budget = hours_text(lost)
    return f"cost {budget} of budget ({', '.join(jobs)})" if jobs else f"cost {budget}"


def incident_lines(incidents: list[dict[str, Any]], now: float | None = None) -> list[str]:
    """One line per incident, newest first, the cause first: what can be cut is last."""
    now = time.time() if now is None else now
    out = []
    for i in incidents:
        parts = [f"{i['severity']:<8} {i['kind'].replace('_', ' ')} {i['where']}",
                 span_text(i["onset"], i["ended"], now)]
        cost = cost_text(i)
        if cost:
            parts.append(cost)
        if i["flaps"]:
            parts.append(f"came back {i['flaps']} time{'s' if i['flaps'] != 1 else ''}")
        parts.append(i["message"])
        out.append("; ".join(parts))
    return out
