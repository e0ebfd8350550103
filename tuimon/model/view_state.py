"""What a view holds and tells, owned by the model: which nodes it shows, in which order
(ViewState: filter, sort, topology groups); what it wants of the sources (ViewWants: the
nodes it looks at closely, the fields its map draws), the one thing a view writes to the
model's ClusterState; and a replay's controls (ReplayControl: the player's keys set them,
the replay task obeys them).

Plain Python, so the app's behaviour (filter by regex, sort by metric, group by leaf)
is tested without a screen. The views read the model and write to it only through these
(tests/test_boundaries.py holds them to it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from tuimon.model.cluster import ClusterState
from tuimon.model.map_kinds import GPU_MAP, NO_DATA, HeatMetric, MapKind
from tuimon.model.node_state import NodeState
from tuimon_core.hostlist import TargetError, expand_hostlists
from tuimon_core.protocol.overview_layout import who

_HOSTLIST = re.compile(r"\[[0-9,\-]+\]")


class ViewWants(Protocol):
    """What a view tells the model it shows, so the sources take no more than it draws:
    ClusterState implements it (its `detail_targets` and `drawn` are what the sources
    read, its listeners tell them). The node screen says which node it looks at; the app
    says what its map draws. Everything else a view does with the model is a read."""

    def set_detail(self, targets: set[str] | frozenset[str]) -> None:
        """Take these nodes whole from now on, and the rest as overviews."""

    def set_drawn(self, fields: frozenset[str] | None) -> None:
        """The sample fields the maps draw from now on (None: every field)."""


@dataclass
class ReplayControl:
    """A replay's controls, shared between the replay task (tuimon.sources.recording,
    which obeys them) and the player's keys (tuimon.ui.replay_app.ReplayApp, which sets them):
    the command that replays makes one and gives it to both."""

    speed: float = 1.0
    paused: bool = False
    position: float = 0.0  # seconds into the recording
    seek_to: float | None = None
    step_once: bool = False


class FilterError(ValueError):
    """A filter that is neither a leaf, a host list nor a valid regular expression."""


@dataclass
class ViewState:
    filter_text: str = ""
    sort: str = "name"
    topology: dict[str, str] = field(default_factory=dict)  # node name -> leaf switch
    cpu_nodes: frozenset[str] = frozenset()  # known to have no GPU
    reverse: bool = False  # sort the other way (best first, or names Z to A)
    _pattern: re.Pattern[str] | None = None
    _names: frozenset[str] | None = None
    # The names the view has: a host list that names none of them is read as a regex.
    known_names: frozenset[str] = frozenset()

    def set_filter(self, text: str) -> None:
        """A leaf switch's name (`leaf01`), a Slurm host list (`gpu[008-015]`, as
        everywhere else), or else text as a substring or regular expression."""
        text = text.strip()
        self._pattern = self._names = None
        if not text:
            self.filter_text = ""
            return
        if text in set(self.topology.values()):
            self._names = frozenset(n for n, leaf in self.topology.items() if leaf == text)
        elif _HOSTLIST.search(text) or ("," in text and " " not in text):
            try:
                self._names = frozenset(expand_hostlists([text]))
            except TargetError as exc:
                raise FilterError(f"bad filter {text!r}: {exc}") from None
            if self.known_names and not self._names & self.known_names:
                # No node has one of those names: it was a regular expression
                # (`node00[1-3]`) after all.
                self._names = None
                self._pattern = re.compile(text, re.IGNORECASE)
        else:
            try:
                self._pattern = re.compile(text, re.IGNORECASE)
            except re.error as exc:
                raise FilterError(f"bad filter {text!r}: {exc}") from None
        self.filter_text = text

    def show_names(self, names: Iterable[str], text: str) -> None:
        """Exactly these nodes (a finding's), under `text` (its host list): node names are
        matched as they are, never read as a pattern."""
        self._pattern = None
        self._names = frozenset(names)
        self.filter_text = text

    def order_text(self, metric_key: str) -> str | None:
        """How the map is ordered, in words (None: by name, A to Z, the default)."""
        if self.sort == "metric":
            return f"sorted by {metric_key}, {'best' if self.reverse else 'worst'} first"
        return "sorted by name, Z to A" if self.reverse else None

    def shows(self, node: NodeState) -> bool:
        """Whether the node passes the filter: by its name, or (a text or regex filter)
        by who runs on it: a Slurm job id, a pod, a user, a training job."""
        if self._names is not None:
            return node.name in self._names or node.target.rsplit(":", 1)[0] in self._names
        pattern = self._pattern
        if pattern is None or pattern.search(node.name):
            return True
        ov = node.overview
        return ov is not None and any(pattern.search(w) for w in who(ov))

    def visible(self, cluster: ClusterState, metric: HeatMetric | None = None,
                kind: MapKind = GPU_MAP) -> list[NodeState]:
        nodes = [n for n in cluster.nodes.values() if self.shows(n)]
        if self.sort == "metric" and metric is not None:
            # The map's own fold: a fabric metric sorts by the node's ports, not its GPUs.
            levels = {id(n): kind.node_level(n, metric, self.cpu_nodes) for n in nodes}

            def key(n: NodeState) -> tuple[int, str]:
                level = levels[id(n)]
                return (-(level if level != NO_DATA else -3), n.name)
            ordered = sorted(nodes, key=key)
            if self.reverse:  # best first, nodes without data still last
                known = [n for n in ordered if levels[id(n)] != NO_DATA]
                seen = {id(n) for n in known}
                ordered = known[::-1] + [n for n in ordered if id(n) not in seen]
            return ordered
        return sorted(nodes, key=lambda n: n.name, reverse=self.reverse)

    def groups(self, nodes: list[NodeState]) -> list[tuple[str, list[NodeState]]]:
        """Nodes grouped by leaf switch when the topology is known, in leaf order."""
        if not self.topology:
            return [("", nodes)]
        out: dict[str, list[NodeState]] = {}
        for n in nodes:
            out.setdefault(self.topology.get(n.name, "unknown leaf"), []).append(n)
        return sorted(out.items())


def parse_topology_conf(text: str) -> dict[str, str]:
    """Slurm topology.conf: `SwitchName=leaf1 Nodes=gpu[001-016]` lines -> node -> leaf."""
    from tuimon_core.hostlist import MAX_TARGETS, expand_hostlist

    out: dict[str, str] = {}
    budget = MAX_TARGETS  # names in the whole file, each list counted before expanding
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        switch, nodes = fields.get("SwitchName"), fields.get("Nodes")
        if switch and nodes:
            names = expand_hostlist(nodes, budget)
            budget -= len(names)
            for name in names:
                out[name] = switch
    return out
