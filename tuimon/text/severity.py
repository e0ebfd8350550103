"""How a finding's severity is coloured, in every view (the diagnosis, the events, a
node's and a job's screens, the history): theme variables, never colours. Information is
the theme's secondary colour, neither the alarm of a warning nor the green of health."""

from __future__ import annotations

SEVERITY_STYLE = {"critical": "$error", "warning": "$warning", "info": "$secondary"}


def severity_style(severity: str) -> str:
    return SEVERITY_STYLE.get(severity, "$foreground")
