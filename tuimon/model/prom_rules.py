"""Prometheus recording and alerting rules for the training SLO, from the app's own numbers.

`rules_yaml(slo)` writes one rule group, `tuimon-training-slo`, that Prometheus 2.x loads
(`rule_files:`). It uses the agent's step counters (docs/metrics.md, "Training jobs") and
the same definitions as tuimon.model.slo (docs/definitions.md):

- SLI = effective compute time / wall time; error ratio = 1 - SLI;
- burn rate = error ratio / (1 - target);
- an alert fires when the burn rate is above `Slo.alert_threshold(long, share)` on both
  its long and its short window, for each entry of `ALERTS`, once the job's counters
  go back over `COVERED_TO_ALERT` of its short window (as the app's `BurnReadout.firing`).

Names (stable; dashboards and routes may rely on them), one pair per window of
`BURN_WINDOWS_S` (5m, 30m, 1h, 6h, 1d, 3d):

- `tuimon:job_sli:rate<window>`: compute seconds / wall seconds per training job;
- `tuimon:job_error_ratio:rate<window>`: 1 - the SLI;
- `tuimon:job_wait_share:rate<window>`, for the windows of `WAIT_WINDOWS` (1h, 3d): the
  share of the step time spent waiting, by `kind` (comm, data, checkpoint, other: what
  the error budget went to);
- alert `TuimonJobErrorBudgetBurn`, one rule per entry of `ALERTS`, told apart by labels
  `severity` (`page` or `ticket`) and `window` (`1h/5m`, `6h/30m`, `1d/6h`, `3d/6h`);
  labels `slo_target` and `slo_window_hours` say which SLO the thresholds come from;
- in a second group, `tuimon-findings`: alert `TuimonFinding` for every critical and
  warning finding a relay's judgement (or an agent's) holds, with the finding's labels
  (`kind`, `severity`, `component`, `node`, `gpu`, `port`, `leaf`, `fs`, `job`) and its
  text as the description: the page names the cause (`congestion leaf01`).

The training job's name is in the counters' `job` label, which Prometheus renames to
`exported_job` when the scrape job's own `job` label clashes with it (the default,
`honor_labels: false`). As the viewer does (tuimon.sources.prom_queries.JOB_BY), the
series are summed by the job label *and* `job`, so the same rules work whichever of the
two holds the name; `{{ or $labels.exported_job $labels.job }}` names the job in the
annotations.

A job with no wall time in a window (no step reported) has no series there, not NaN.
"""

from __future__ import annotations

import json
import re

from tuimon.model.slo import ABOVE, ALERTS, BURN_WINDOWS_S, COVERED_TO_ALERT, Slo

GROUP = "tuimon-training-slo"
ALERT = "TuimonJobErrorBudgetBurn"
WALL = "tuimon_job_wall_seconds_total"
COMPUTE = "tuimon_job_compute_seconds_total"
WAIT = "tuimon_job_wait_seconds_total"
WAIT_WINDOWS = ("1h", "3d")  # the shortest burn window an alert pages on, and the longest

_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# One PromQL label matcher: name, operator, and a quoted value in any of PromQL's quotes.
_MATCHER = re.compile(
    r"\s*(?P<name>[a-zA-Z_][a-zA-Z0-9_]*)\s*(?P<op>=~|!~|!=|=)\s*"
    r"(?P<value>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`)\s*(?P<sep>,|$)")


def sli_record(window: str) -> str:
    return f"tuimon:job_sli:rate{window}"


def error_ratio_record(window: str) -> str:
    return f"tuimon:job_error_ratio:rate{window}"


def wait_share_record(window: str) -> str:
    return f"tuimon:job_wait_share:rate{window}"


def _num(value: float) -> str:
    """A number as PromQL and Python both read it back exactly (repr round-trips)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def quote_yaml(text: str) -> str:
    """A YAML double-quoted scalar. JSON's escapes are all valid YAML escapes, and
    non-ASCII is kept as is (YAML has no surrogate-pair escapes)."""
    return json.dumps(text, ensure_ascii=False)


def parse_selector(selector: str) -> list[tuple[str, str, str]]:
    """(name, operator, quoted value) per matcher; ValueError for anything else, so that a
    selector cannot close the braces and append PromQL or YAML of its own."""
    text = selector.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    # YAML and str.splitlines() also break lines at NEL, LS and PS.
    if any(ord(c) < 0x20 or c in "\x7f\x85\u2028\u2029" for c in text):
        raise ValueError(f"selector contains control characters: {selector!r}")
    out: list[tuple[str, str, str]] = []
    pos = 0
    while pos < len(text):
        m = _MATCHER.match(text, pos)
        if m is None:
            raise ValueError(f"not a PromQL label matcher list: {selector!r} "
                             f"(expected e.g. cluster=\"a\",partition=~\"gpu.*\")")
        if m["name"] == "__name__":
            raise ValueError("the selector may not match __name__")
        out.append((m["name"], m["op"], m["value"]))
        pos = m.end()
        if m["sep"] == "," and not text[pos:].strip():
            break  # PromQL allows a trailing comma
    return out


def _by_labels(job_label: str, matchers: list[tuple[str, str, str]]) -> list[str]:
    """Labels the sums keep: the job's name (both places it may be) and every label the
    selector pins with `=`. Pinned labels hold one value across the selection, so they do
    not split a job's series, and they keep the records of rule files for different
    selectors (clusters) apart in one Prometheus."""
    by = [job_label] if job_label == "job" else [job_label, "job"]
    for name, op, _value in matchers:
        if op == "=" and name not in by:
            by.append(name)
    return by


def selector_text(matchers: list[tuple[str, str, str]]) -> str:
    return ",".join(f"{name}{op}{value}" for name, op, value in matchers)


def yaml_block(key: str, text: str, indent: int) -> list[str]:
    """`key: |-` and the text as a literal block: PromQL stays readable and needs no
    escaping (the selector, the only outside text, has no line breaks)."""
    pad = " " * indent
    return [f"{pad}{key}: |-", *(f"{pad}  {line}" for line in text.splitlines())]


def _annotations(slo: Slo, severity: str, long_w: str, short_w: str, share: float,
                 threshold: float, job_name: str) -> dict[str, str]:
    capped = threshold < share * slo.window_hours / (BURN_WINDOWS_S[long_w] / 3600)
    why = (f"{share:.0%} of the {_num(slo.window_hours)} h error budget in {long_w}"
           + (f", capped at 90% of the highest possible burn rate "
              f"{slo.max_burn_rate:.1f}x" if capped else ""))
    return {
        "summary": (f"Training job {job_name} burns its SLO error budget at "
                    f"{{{{ $value | printf \"%.1f\" }}}}x over {long_w} ({severity})"),
        "description": (
            f"Training job {job_name}: burn rate {{{{ $value | printf \"%.2f\" }}}}x over "
            f"{long_w}, and over {short_w} too, above {threshold:.2f}x ({why}), with the "
            f"job's counters going back over {COVERED_TO_ALERT:.0%} of {short_w}. "
            f"SLO: compute time / wall time >= {_num(slo.target)} over "
            f"{_num(slo.window_hours)} h; burn rate = error ratio / (1 - target), from "
            f"{error_ratio_record(long_w)} and {error_ratio_record(short_w)}."),
    }


def rules_yaml(slo: Slo, *, job_label: str = "exported_job", selector: str = "") -> str:
    """The rule file for `slo`, as YAML text (see the module docstring for the names).

    `job_label`: the label holding the training job's name (`exported_job` after
    Prometheus' rename, `job` with `honor_labels: true`, or a relabelled name).
    `selector`: extra label matchers for the counters, e.g. `cluster="a"`.
    """
    if not _LABEL.fullmatch(job_label):
        raise ValueError(f"not a Prometheus label name: {job_label!r}")
    matchers = parse_selector(selector)
    by = ", ".join(_by_labels(job_label, matchers))
    counter_sel = "{" + selector_text(matchers) + "}" if matchers else ""
    # Records carry only the `=` matchers' labels; selecting by them keeps this file's
    # alerts and error ratios off the records another file (another cluster) writes.
    pinned = [m for m in matchers if m[1] == "="]
    record_sel = "{" + selector_text(pinned) + "}" if pinned else ""
    job_name = ("{{ $labels.job }}" if job_label == "job"
                else f"{{{{ or $labels.{job_label} $labels.job }}}}")
    target, hours = _num(slo.target), _num(slo.window_hours)

    lines = [
        "# Prometheus rules for tuimon's training SLO, written by `tuimon rules`.",
        f"# SLO target {target} (compute time / wall time) over {hours} h; error budget "
        f"{slo.budget_hours:g} h.",
        "# Burn rate = error ratio / (1 - target); each alert needs its long and its short",
        "# window above the threshold tuimon itself uses (tuimon.model.slo.ALERTS), and",
        "# the job's counters going back over 90 % of the short window (as the app).",
        f"# Selector: {selector.strip() or '(none)'}; training job label: {job_label}.",
        "groups:",
        f"  - name: {quote_yaml(GROUP)}",
        "    rules:",
    ]
    for window in BURN_WINDOWS_S:
        # `> 0` drops a job whose wall time did not move: no series rather than NaN/Inf.
        sli = (f"sum by ({by}) (rate({COMPUTE}{counter_sel}[{window}]))\n"
               f"  / (sum by ({by}) (rate({WALL}{counter_sel}[{window}])) > 0)")
        lines += [f"      - record: {quote_yaml(sli_record(window))}",
                  *yaml_block("expr", sli, 8)]
        # Rules of a group run in order at one timestamp, so this sees the SLI just written.
        lines += [f"      - record: {quote_yaml(error_ratio_record(window))}",
                  *yaml_block("expr", f"1 - {sli_record(window)}{record_sel}", 8)]
        if window in WAIT_WINDOWS:
            waits = (f"sum by ({by}, kind) (rate({WAIT}{counter_sel}[{window}]))\n"
                     f"  / on ({by}) group_left ()\n"
                     f"  (sum by ({by}) (rate({WALL}{counter_sel}[{window}])) > 0)")
            lines += [f"      - record: {quote_yaml(wait_share_record(window))}",
                      *yaml_block("expr", waits, 8)]
    allowed = f"(1 - {target})"  # PromQL computes 1 - target as Python does: same floats
    for severity, long_w, short_w, share in ALERTS:
        threshold = _num(slo.alert_threshold(long_w, share) * ABOVE)
        # As the app: only once the job's counters go back over most of the short window
        # (its wall counter had a sample COVERED_TO_ALERT of the window ago), not from
        # the first minutes of a run.
        seen = f"{COVERED_TO_ALERT * BURN_WINDOWS_S[short_w]:.0f}s"
        expr = (f"{error_ratio_record(long_w)}{record_sel} / {allowed} > {threshold}\n"
                f"and\n"
                f"{error_ratio_record(short_w)}{record_sel} / {allowed} > {threshold}\n"
                f"and on ({by})\n"
                f"max by ({by}) ({WALL}{counter_sel} offset {seen})")
        labels = {"severity": severity, "window": f"{long_w}/{short_w}",
                  "slo_target": target, "slo_window_hours": hours}
        notes = _annotations(slo, severity, long_w, short_w, share,
                             slo.alert_threshold(long_w, share), job_name)
        lines += [f"      - alert: {quote_yaml(ALERT)}", *yaml_block("expr", expr, 8),
                  "        labels:"]
        lines += [f"          {key}: {quote_yaml(value)}" for key, value in labels.items()]
        lines += ["        annotations:"]
        lines += [f"          {key}: {quote_yaml(value)}" for key, value in notes.items()]
    lines += finding_rules(selector_text(matchers))
    return "\n".join(lines) + "\n"


# The findings' alerts: a second group, over the `tuimon_finding` series a relay (every
# finding its judgement holds, cluster ones included) and the agents (their node-local
# ones) export. The finding is already held and cleared with hysteresis where it was
# judged, so `for` only rides out a missed scrape.
FINDINGS_GROUP = "tuimon-findings"
FINDING_ALERT = "TuimonFinding"
FINDING_FOR = "30s"


def finding_rules(selector: str = "") -> list[str]:
    """One alert over every critical and warning finding, with the
    finding's own labels (kind, component and each of node, gpu, port, leaf, fs, job) to
    route and group on, and its text in the annotations, read from `tuimon_finding_info`
    at the time (a text that changes does not raise the alert again)."""
    sel = f",{selector}" if selector else ""
    text = ('{{ with printf "tuimon_finding_info{kind=%q,component=%q}" '
            '$labels.kind $labels.component | query }}{{ range . }}'
            '{{ .Labels.text }}{{ end }}{{ end }}')
    return [f"  - name: {quote_yaml(FINDINGS_GROUP)}", "    rules:",
            f"      - alert: {quote_yaml(FINDING_ALERT)}",
            *yaml_block("expr", f'tuimon_finding{{severity=~"critical|warning"{sel}}} == 1',
                        8),
            f"        for: {FINDING_FOR}",
            "        annotations:",
            "          summary: " + quote_yaml(
                "{{ $labels.kind }} {{ $labels.component }} ({{ $labels.severity }})"),
            "          description: " + quote_yaml(text)]
