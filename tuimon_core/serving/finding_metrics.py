"""Findings as Prometheus metric families: one definition for every process that serves
them (the agent its node's own, the relay and `tuimon prom --serve` their whole
judgement), so one alert rule (`tuimon rules`, TuimonFinding) pages on any of them.

`tuimon_finding` is 1 while a finding holds, labelled by its component field by field;
`tuimon_finding_info` carries its text (a series of its own: the text may change while
the finding holds, and an alert on the first is not raised again); and
`tuimon_finding_since_seconds` when its condition began. The families are always
present, empty when nothing holds, so a rule over them is valid before any fault.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import GaugeMetricFamily, Metric

from tuimon_core.findings import Finding

# The labels that name a finding's component, each from its field of the same name: a
# bounded set whatever the finding (docs/metrics.md), so an alert can route on them.
# `source`: the target a node's findings were read from (the one that holds its name).
FINDING_LABELS = ("kind", "severity", "component", "node", "gpu", "port", "leaf", "fs",
                  "job", "source")


def _labels(f: Finding, source: str) -> list[str]:
    return [f.kind, f.severity, f.where, f.node or "", "" if f.gpu is None else str(f.gpu),
            f.port or "", f.leaf or "", f.fs or "", f.job or "", source]


def finding_families(findings: list[Finding], who: str,
                     source_of: Callable[[str], str | None] = lambda node: None,
                     to_wall: Callable[[float], float] = lambda t: t) -> list[Metric]:
    """The findings held now as the three families. `who` says whose judgement they are
    in the families' help (`the agent's node-local rules`, `this relay's judgement`);
    `source_of` gives the target a node's findings were read from; `to_wall` turns the
    clock the findings were judged on into Unix time (the agent judges on its monotonic
    clock)."""
    finding = GaugeMetricFamily(
        "tuimon_finding", f"A finding {who} holds now (1 while it holds, raised and "
        "cleared with the app's hold and hysteresis): its kind, severity (critical, "
        "warning, info) and component, by field", labels=list(FINDING_LABELS))
    info = GaugeMetricFamily(
        "tuimon_finding_info", "What a finding says, for an alert's annotation (1; the "
        "text in the `text` label)", labels=["kind", "component", "text"])
    since = GaugeMetricFamily(
        "tuimon_finding_since_seconds", "When the finding's condition began (Unix time)",
        labels=["kind", "component"])
    seen: set[tuple[str, str]] = set()
    for f in findings:
        key = (f.kind, f.where)
        if key in seen:  # one series a component (two targets' findings of one node)
            continue
        seen.add(key)
        finding.add_metric(_labels(f, (source_of(f.node) or "") if f.node else ""), 1)
        info.add_metric([f.kind, f.where, f.message], 1)
        if f.first_seen is not None:
            since.add_metric([f.kind, f.where], to_wall(f.first_seen))
    return [finding, info, since]
