"""The Prometheus text format of a registry's families, written in one pass.

prometheus_client's `generate_latest` checks and escapes every label name of every
sample line against the UTF-8 naming rules: on an agent's scrape (a full node, about
1,100 lines) that is most of the scrape's CPU, paid again each scrape for the same few
dozen names. Our families are counters and gauges with fixed names, so their text is
written here with each name escaped once (by prometheus_client's own escaping, then
remembered), label values escaped as the format says, and each label set's text
remembered too (a full node's 800 lines carry a few hundred label sets). The text is
byte for byte what `generate_latest` writes (a test holds the two side by side); a
family of any other kind, or a sample with a timestamp, is left to `generate_latest`
whole.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

try:
    from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
except ImportError:  # prometheus_client before its UTF-8 names wrote names as they are
    def escape_metric_name(s: str, escaping: str = "") -> str:
        return s

    def escape_label_name(s: str, escaping: str = "") -> str:
        return s

_PLAIN = frozenset({"counter", "gauge"})
_OM = ("_created", "_gsum", "_gcount")  # OpenMetrics samples generate_latest moves


class _Families(Collector):
    """Families already collected, as a registry `generate_latest` can read."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def render(registry: Collector) -> bytes:
    """The registry's families in the text format (what `generate_latest` writes)."""
    families = list(registry.collect())
    if not all(m.type in _PLAIN and all(s.timestamp is None and not s.name.endswith(_OM)
                                        for s in m.samples) for m in families):
        return generate_latest(_Families(families))
    out: list[str] = []
    for m in families:
        name = _metric(m.name + "_total" if m.type == "counter" else m.name)
        doc = m.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {m.type}\n")
        for s in m.samples:
            if s.labels:
                out.append(f"{_metric(s.name)}{_labels(tuple(s.labels.items()))} "
                           f"{_number(s.value)}\n")
            else:
                out.append(f"{_metric(s.name)} {_number(s.value)}\n")
    return "".join(out).encode("utf-8")


# Names are the code's own, the same few dozen every scrape: each escaped once.
@functools.lru_cache(maxsize=4096)
def _metric(name: str) -> str:
    return escape_metric_name(name)


@functools.lru_cache(maxsize=4096)
def _label(name: str) -> str:
    return escape_label_name(name)


# A node's label sets are the same few hundred every scrape (a GPU's, a port's, a
# mount's, each under forty metrics): each is written once, not once a line. Bounded: a
# label set that churns (a process's name) costs a miss, never memory.
@functools.lru_cache(maxsize=8192)
def _labels(items: tuple[tuple[str, str], ...]) -> str:
    return "{" + ",".join(f'{_label(k)}="{_value(v)}"' for k, v in sorted(items)) + "}"


def _number(value: float) -> str:
    """floatToGoString's text, without its tests where repr is already the answer."""
    d = float(value)
    s = repr(d)
    dot = s.find(".")
    if dot < 0 or (dot > 6 and d > 0):  # inf, nan, exponents; Go's earlier exponent
        return floatToGoString(d)
    return s


def _value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
