"""Recording rules for `tuimon prom`'s live queries, for sites where the server should
evaluate them once per interval rather than once per refresh of every viewer.

`tuimon rules --live` writes two groups:
  - `tuimon-live`, evaluated every `--every` seconds: one record per query of RECORDED,
    named `tuimon:live_<query>` (record_name);
  - `tuimon-inventory`, evaluated as often as the viewer reads the inventory
    (prom_queries.INVENTORY_EVERY_S): one record per query of INVENTORY_RECORDED, named
    `tuimon:inventory_<query>` (inventory_name). Those read whole GPU families to
    return a few series per GPU or port: at 4096 nodes, seconds of the server's time at
    each viewer's first look (`--once`).
Each expression is the query itself as `tuimon prom` would send it (the same `--match`
and `--node-label`), wrapped so that the name of the series each value came from
survives as the label `tuimon_series` (a record replaces `__name__`). `tuimon prom
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
INVENTORY_GROUP = "tuimon-inventory"
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
    "ib_tx": q.PORT_BY, "ib_rx": q.PORT_BY, "ib_wait": q.PORT_BY,
    "ib_errors": _PORT + ", counter",  # which counter our agent could not read
}
# The inventory's queries likewise. `gpu_drawn` records the GPUs with a series of any
# field asked only while drawn: the viewer's own query names those it does not ask now,
# but a GPU it asks them of is known by their answer anyway.
INVENTORY_RECORDED: dict[str, str] = {
    "gpu_slow": _GPU, "gpu_total": _GPU, "gpu_info": q.INFO_BY, "port_rate": _PORT,
    "gpu_drawn": q.FB_BY, "gpu_exported": NAME_LABEL + ", {ids}",
}
# Seconds between two evaluations: at least 1, and at most a minute (a record older
# than Prometheus' 5 min look-back would vanish from the answers).
EVERY_S = (1.0, 60.0)


def record_name(query: str) -> str:
    return f"tuimon:live_{query}"


def inventory_name(query: str) -> str:
    return f"tuimon:inventory_{query}"


def inventory_query(name: str) -> str:
    """The template of an inventory query as recorded (gpu_drawn's of every field)."""
    return q.INVENTORY_QUERIES[name] or q.gpu_drawn_query(q.DRAWN_ONLY_GPU)


def selector(match: str) -> str:
    """The site's matchers as PromQL reads them inside braces (`{cluster="a"}` and
    `cluster="a"` alike); ValueError for a selector that is not matchers."""
    return selector_text(parse_selector(match))


def rule_ids(node_labels: Iterable[str], match: str) -> tuple[str, ...]:
    """The labels a record keeps besides the query's own: who a series is, and every
    label the site's matchers name (ValueError for a selector that is not matchers)."""
    named = [name for name, _, _ in parse_selector(match)]
    return tuple(dict.fromkeys((*identity_labels(node_labels), *named)))


def _record(name: str, query: str) -> list[str]:
    expr = f'label_replace(\n  {query},\n  "{NAME_LABEL}", "$1", "__name__", "(.+)")'
    return [f"      - record: {quote_yaml(name)}", *yaml_block("expr", expr, 8)]


def live_rules_yaml(match: str = "", node_labels: Iterable[str] = (),
                    every: float = 5.0,
                    inventory_every: float = q.INVENTORY_EVERY_S) -> str:
    """The rule file, as YAML text. ValueError for a selector that is not matchers, or
    an interval out of EVERY_S."""
    labels = list(node_labels)
    for flag, value in (("--every", every), ("the inventory's interval", inventory_every)):
        if not EVERY_S[0] <= value <= EVERY_S[1]:
            raise ValueError(f"{flag} {value:g}: the rules' interval must be "
                             f"{EVERY_S[0]:g} to {EVERY_S[1]:g} s")
    match = selector(match)
    ids = rule_ids(labels, match)
    # One group per cluster: Mimir's ruler keeps one group of a name per namespace.
    suffix = f" {{{match}}}" if match else ""
    lines = [
        "# Recording rules for `tuimon prom --recorded`, written by `tuimon rules --live`.",
        f"# Selector: {match or '(none)'}; node labels: "
        f"{', '.join(labels) or '(the built-in order)'}.",
        "# Load them where the series are stored (Prometheus, Thanos Ruler, Mimir's ruler,",
        "# vmalert), then run tuimon prom with --recorded and the same --match and",
        "# --node-label.",
        "groups:",
        f"  - name: {quote_yaml(GROUP + suffix)}",
        f"    interval: {round(every * 1000)}ms",
        "    rules:",
    ]
    for name in RECORDED:
        lines += _record(record_name(name), q.render(q.LIVE_QUERIES[name], match, ids))
    lines += [f"  - name: {quote_yaml(INVENTORY_GROUP + suffix)}",
              f"    interval: {round(inventory_every * 1000)}ms",
              "    rules:"]
    for name in INVENTORY_RECORDED:
        lines += _record(inventory_name(name), q.render(inventory_query(name), match, ids))
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
        out[name] = _folded(record_name(name), by, ids, match, None if names is None else
                            f'{NAME_LABEL}=~"{"|".join(names)}"')
    return out


def presence_query(match: str, ids: Iterable[str]) -> str:
    """prom_queries.presence_query, of the GPU record: one series a node (the record
    holds the dense fields: of PRESENCE_GPU, the temperature; a profiling-only node is
    not among them, docs/metrics.md)."""
    names = "|".join(q.gpu_names([k for k in q.PRESENCE_GPU if k in q.DENSE_GPU]))
    return _folded(record_name("gpu"), "{ids}", ids, match, f'{NAME_LABEL}=~"{names}"')


def recorded_inventory(match: str, ids: Iterable[str]) -> dict[str, str]:
    """The queries `--recorded` sends instead of the inventory's, folded likewise."""
    return {name: _folded(inventory_name(name), by, ids, match)
            for name, by in INVENTORY_RECORDED.items()}


def _folded(record: str, by: str, ids: Iterable[str], *matchers: str | None) -> str:
    return (f"max by ({by.format(ids=', '.join(ids) or 'instance')}) "
            f"({record}{{{','.join(filter(None, matchers))}}})")


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
