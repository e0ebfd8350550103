"""What changes rarely, asked once a minute and kept between (prom_queries'
INVENTORY_QUERIES: the GPUs' totals, names, UUIDs and bus ids, the health counters
exported, the ports' rates, the GPUs known only by a field asked while drawn): its
answers, what they say of each node (read once per inventory, not at every refresh: a
quarter of the series a refresh would read again), and whether a GPU lacks what it gives
(a node new since), so that the next runs soon."""

from __future__ import annotations

from collections.abc import Collection

from tuimon.sources import prom_queries as q
from tuimon.sources.prom_answers import Series
from tuimon.sources.prom_assembly import Kept, Node, learn_matcher, namer, read_gpus
from tuimon.sources.prom_nodes import NodeNames
from tuimon.sources.prom_values import as_int

# A GPU (node, index, MIG instance) without its total; index -1: a node with GPUs, none
# of them known yet.
Lacking = tuple[str, int, int | None]


def read_inventory(a: dict[str, Series], resolver: NodeNames) -> dict[str, Kept]:
    """The inventory's answers, by node."""
    kept: dict[str, Kept] = {}
    node = namer(resolver, kept, Kept)
    # The total made from used + free first: an exporter's own total, after, wins.
    for answer in q.TOTALS:
        read_gpus(a.get(answer, []), node)
    # What each GPU is: its UUID, model and bus id; and the label matchers that select
    # the node's series.
    for labels, _ in a.get("gpu_info", []):
        index = as_int(labels.get("gpu"))
        n = node(labels) if index is not None else None
        if n is None or index is None:
            continue
        learn_matcher(n.matchers, resolver, labels)
        info = n.gpu_info.setdefault(index, {})
        info.setdefault("uuid", labels.get("uuid") or labels.get("UUID"))
        info.setdefault("name", labels.get("modelName") or labels.get("name"))
        info.setdefault("pci_bus_id", labels.get("pci_bus_id"))
    for labels, _ in a.get("gpu_drawn", []):
        index = as_int(labels.get("gpu"))
        n = node(labels) if index is not None else None
        if n is not None and index is not None:
            n.drawn.add(index)
    for labels, _ in a.get("gpu_exported", []):
        entry = q.GPU_SERIES.get(labels.get("__name__", ""))
        n = node(labels) if entry is not None else None
        if n is not None and entry is not None:
            n.exported.add(entry[0])
    for labels, value in a.get("port_rate", []):
        n = node(labels)
        if n is not None:
            n.port_rates[f"{labels.get('device')}:{labels.get('port')}"] = value
    return kept


class Inventory:
    """The inventory's answers between its runs, and what they say of each node."""

    def __init__(self) -> None:
        self.answers: dict[str, Series] = {}
        self.failed: set[str] = set()  # asked again at the next refresh
        # A GPU without its total (new since the inventory): the inventory runs soon.
        self.due = False
        self._kept: dict[str, Kept] = {}
        self._kept_hosts: dict[str, str] | None = None  # the host names it was read with
        self.lacking_since: dict[Lacking, float] = {}  # monotonic
        self._lacking_after: set[Lacking] = set()

    def take(self, asked: Collection[str], answers: dict[str, Series],
             failed: Collection[str]) -> None:
        """The answers of the inventory queries a refresh `asked` (those `failed` kept
        from before, and asked again next time)."""
        fresh = {n: answers[n] for n in asked if n not in failed}
        self.answers.update(fresh)
        if fresh:
            self._kept_hosts = None  # read again
        self.failed = (self.failed - set(asked)) | (set(failed) & set(asked))

    def forget(self, name: str) -> None:
        self.answers.pop(name, None)

    def kept(self, resolver: NodeNames) -> dict[str, Kept]:
        """What the answers say of each node, read again when they or the host names
        they are read with changed."""
        if self._kept_hosts != resolver.hosts:
            self._kept = read_inventory(self.answers, resolver)
            self._kept_hosts = dict(resolver.hosts)
        return self._kept

    def note_lacking(self, nodes: Collection[Node], clock: float,
                     asked_at: float | None, age: float = 0.0) -> None:
        """The GPUs without their total now (whether or not their memory used was
        asked); `asked_at`: when the whole inventory was asked, where this refresh took
        its answers. Brought forward only for one the last inventory did not already
        leave so (an exporter that gives no total at all would otherwise have it run
        every 15 s for ever); `age`: how old the totals' records may be (a GPU newer
        than their last evaluation is not in them yet)."""
        lacking = {(n.name, i, gi) for n in nodes
                   for i, gi, g in [*((i, None, g) for i, g in n.gpus.items()),
                                    *((i, gi, v) for i, m in n.mig.items()
                                      for gi, v in m.items())]
                   if "mem_total" not in g}
        # A node with GPUs, none of them known to the inventory yet: it tells them.
        lacking |= {(n.name, -1, None) for n in nodes if n.present and not n.gpus}
        self.lacking_since = {k: self.lacking_since.get(k, clock) for k in lacking}
        if asked_at is not None:
            self._lacking_after = {k for k, since in self.lacking_since.items()
                                   if since <= asked_at - age}
        self.due = bool(lacking - self._lacking_after)
