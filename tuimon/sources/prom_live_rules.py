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

from tuimon.model.prom_rules import parse_selector, quote_yaml, yaml_block
from tuimon.sources import prom_queries as q
from tuimon.sources.prom_nodes import identity_labels

GROUP = "tuimon-live"
# The live queries worth recording: each reads a whole family of series (every GPU's
# fields, every port's counters) to return a few per GPU or port. The rest select a
# few series as they are (failed scrapes, node_exporter's uname, the jobs' counters)
# and cost the server little.
RECORDED = ("gpu", "gpu_busy", "gpu_sparse", "host", "host_cpu", "port_state",
            "port_phys_state", "ib_tx", "ib_rx", "ib_wait", "ib_errors")
# Where a record keeps the name of the series a value came from.
NAME_LABEL = "tuimon_series"


def record_name(query: str) -> str:
    return f"tuimon:live_{query}"


def rule_ids(node_labels: Iterable[str], match: str) -> tuple[str, ...]:
    """The labels a record keeps besides the query's own: who a series is, and every
    label the site's matchers name (ValueError for a selector that is not matchers)."""
    named = [name for name, _, _ in parse_selector(match)]
    return tuple(dict.fromkeys((*identity_labels(node_labels), *named)))


def live_rules_yaml(match: str = "", node_labels: Iterable[str] = (),
                    every: float = 5.0) -> str:
    """The rule file, as YAML text. ValueError for a selector that is not matchers."""
    labels = list(node_labels)
    ids = rule_ids(labels, match)
    lines = [
        "# Recording rules for `tuimon prom --recorded`, written by `tuimon rules --live`.",
        f"# Selector: {match.strip() or '(none)'}; node labels: "
        f"{', '.join(labels) or '(the built-in order)'}.",
        "# Load them where the series are stored (Prometheus, Thanos Ruler, Mimir's ruler,",
        "# vmalert), then run tuimon prom with --recorded and the same --match and",
        "# --node-label.",
        "groups:",
        f"  - name: {quote_yaml(GROUP)}",
        f"    interval: {every:g}s",
        "    rules:",
    ]
    for name in RECORDED:
        query = q.render(q.LIVE_QUERIES[name], match, ids)
        expr = f'label_replace(\n  {query},\n  "{NAME_LABEL}", "$1", "__name__", "(.+)")'
        lines += [f"      - record: {quote_yaml(record_name(name))}",
                  *yaml_block("expr", expr, 8)]
    return "\n".join(lines) + "\n"


def recorded_queries(match: str) -> dict[str, str]:
    """The queries `--recorded` sends instead of RECORDED's: the records, selected. `+ 0`
    drops the record's name from every answer (the value's own is in NAME_LABEL): sent
    with each of hundreds of thousands of series, it would add a quarter to the bytes."""
    return {name: f"{record_name(name)}{{{match}}} + 0" for name in RECORDED}


def restore_names(series: Iterable[tuple[dict[str, str], float]]) -> None:
    """A record's series as the query's own: the series name back where it was, the
    record's name gone."""
    for labels, _ in series:
        name = labels.pop(NAME_LABEL, None)
        if name is None:
            labels.pop("__name__", None)
        else:
            labels["__name__"] = name
