"""Recording rules for `tuimon prom`'s live queries, for sites where the server should
evaluate them once per interval rather than once per refresh of every viewer.

`tuimon rules --live` writes one group, `tuimon-live`, evaluated every `--every`
seconds: one record per query of RECORDED, named `tuimon:live_<query>` (record_name),
whose expression is the query itself as `tuimon prom` would send it (the same
`--match` and `--node-label`), wrapped so that the name of the series each value came
from survives as the label `tuimon_series` (a record replaces `__name__`). `tuimon prom
--recorded` then selects these records instead of evaluating the queries, and reads the
answers as it reads the queries' own (restore_names).

The records keep the labels that say whose a series is and every label the site's
matchers name, so one Prometheus can hold the records of several clusters (one rule
file per `--match`) and the viewer's `--match` selects its own.
"""

from __future__ import annotations

from collections.abc import Iterable

from tuimon.model.prom_rules import parse_selector, quote_yaml, selector_text, yaml_block
from tuimon.sources import prom_queries as q
from tuimon.sources.prom_nodes import identity_labels, quoted

GROUP = "tuimon-live"
# Where a record keeps the name of the series a value came from.
NAME_LABEL = "tuimon_series"
# The live queries worth recording, with the labels their answers keep: each reads a
# whole family of series (every GPU's fields, every port's counters) to return a few per
# GPU or port. The rest select a few series as they are (failed scrapes,
# node_exporter's uname, the jobs' counters) and cost the server little.
_GPU = q.GPU_BY.replace("__name__", NAME_LABEL)
_PORT = q.PORT_BY + ", " + NAME_LABEL
RECORDED: dict[str, str] = {
    "gpu": _GPU, "gpu_busy": _GPU, "gpu_sparse": _GPU,
    "host": NAME_LABEL + ", {ids}", "host_cpu": "{ids}",
    "port_state": _PORT, "port_phys_state": _PORT,
    "ib_tx": q.PORT_BY, "ib_rx": q.PORT_BY, "ib_wait": q.PORT_BY, "ib_errors": _PORT,
}
# Seconds between two evaluations: at least 1, and at most a minute (a record older
# than Prometheus' 5 min look-back would vanish from the answers).
EVERY_S = (1.0, 60.0)


def record_name(query: str) -> str:
    return f"tuimon:live_{query}"


def selector(match: str) -> str:
    """The site's matchers as PromQL reads them inside braces (`{cluster="a"}` and
    `cluster="a"` alike); ValueError for a selector that is not matchers."""
    return selector_text(parse_selector(match))


def rule_ids(node_labels: Iterable[str], match: str) -> tuple[str, ...]:
    """The labels a record keeps besides the query's own: who a series is, and every
    label the site's matchers name (ValueError for a selector that is not matchers)."""
    named = [name for name, _, _ in parse_selector(match)]
    return tuple(dict.fromkeys((*identity_labels(node_labels), *named)))


def live_rules_yaml(match: str = "", node_labels: Iterable[str] = (),
                    every: float = 5.0) -> str:
    """The rule file, as YAML text. ValueError for a selector that is not matchers, or
    an interval out of EVERY_S."""
    labels = list(node_labels)
    if not EVERY_S[0] <= every <= EVERY_S[1]:
        raise ValueError(f"--every {every:g}: the rules' interval must be "
                         f"{EVERY_S[0]:g} to {EVERY_S[1]:g} s")
    match = selector(match)
    ids = rule_ids(labels, match)
    # One group per cluster: Mimir's ruler keeps one group of a name per namespace.
    group = f"{GROUP} {{{match}}}" if match else GROUP
    lines = [
        "# Recording rules for `tuimon prom --recorded`, written by `tuimon rules --live`.",
        f"# Selector: {match or '(none)'}; node labels: "
        f"{', '.join(labels) or '(the built-in order)'}.",
        "# Load them where the series are stored (Prometheus, Thanos Ruler, Mimir's ruler,",
        "# vmalert), then run tuimon prom with --recorded and the same --match and",
        "# --node-label.",
        "groups:",
        f"  - name: {quote_yaml(group)}",
        f"    interval: {round(every * 1000)}ms",
        "    rules:",
    ]
    for name in RECORDED:
        query = q.render(q.LIVE_QUERIES[name], match, ids)
        expr = f'label_replace(\n  {query},\n  "{NAME_LABEL}", "$1", "__name__", "(.+)")'
        lines += [f"      - record: {quote_yaml(record_name(name))}",
                  *yaml_block("expr", expr, 8)]
    return "\n".join(lines) + "\n"


def recorded_queries(match: str, ids: Iterable[str],
                     only: dict[str, list[str]] | None = None) -> dict[str, str]:
    """The queries `--recorded` sends instead of RECORDED's: the records, folded to the
    labels the query's own answers have. That drops the record's name (the value's own
    is in NAME_LABEL), which sent with each of hundreds of thousands of series would add
    a quarter to the bytes, and folds what the store adds: the replicas of an HA pair
    behind Thanos, as the query's own `max by` does. `only` narrows a record to the
    values of these series names (the GPU fields the maps draw)."""
    out = {}
    for name, by in RECORDED.items():
        names = (only or {}).get(name)
        matchers = ",".join(filter(None, (match, None if names is None else
                                          f'{NAME_LABEL}=~"{"|".join(names)}"')))
        out[name] = (f"max by ({by.format(ids=', '.join(ids) or 'instance')}) "
                     f"({record_name(name)}{{{matchers}}})")
    return out


def evaluated_query(match: str, probes: dict[str, dict[str, str]]) -> str:
    """When the server last evaluated each of these records, told by the series of one
    node or port of each (`probes`: a record's name -> the labels of a series it
    answered at the last read), each time labelled RECORD_LABEL with the record's name;
    "" where there is none. A few series, not the whole record: the newest sample of
    every series of the GPU record took the server 2 s at 4096 nodes, a few series'
    takes nothing. A rule's series are stored at once, so a few stand for the record;
    but a group's records are stored one after another (a ruler, vmalert in batches),
    so each is asked."""
    parts = []
    for name, labels in probes.items():
        matchers = [f'__name__="{record_name(name)}"',
                    *(f"{key}={quoted(value)}" for key, value in sorted(labels.items())), match]
        parts.append(f'label_replace(max(timestamp({{{",".join(filter(None, matchers))}}})), '
                     f'"{RECORD_LABEL}", "{name}", "", "")')
    return " or ".join(parts)


# Where evaluated_query keeps each record's time apart (`or` joins only other labels).
RECORD_LABEL = "tuimon_record"


def restore_names(series: Iterable[tuple[dict[str, str], float]]) -> None:
    """A record's series as the query's own: the series name back where it was (the
    folding in recorded_queries already dropped the record's)."""
    for labels, _ in series:
        name = labels.pop(NAME_LABEL, None)
        if name is not None:
            labels["__name__"] = name
