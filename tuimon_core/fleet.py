"""The fleet compared with itself: what most nodes have (a driver, a firmware, a kernel,
eight GPUs, eighteen NVLinks a GPU, 400 Gb/s ports, Gen5 x16 from each GPU to its root
port), and the few that differ, named as host lists. A node that differs is not broken;
it is the first place to look when it is the slow one (a job is as fast as its slowest
rank).

Read from the nodes' hellos (what each agent says it is made of), so the viewer, `tuimon
status` and the relay compare the same things. A value is judged only where at least
MIN_NODES nodes report it. The usual value is the one more nodes have than any other
(not necessarily more than half: 2:1:1 names the two odd nodes, a third value from one
more node does not hide the first two's difference); the others are named, with the
usual value and its count. Where the most common values tie (2:2, 1:1:1), there is no
usual value: the fleet is split, and every group is named. A node is one vote: nodes
are keyed by name, and a name said by two targets counts once, from the target that
holds it (tuimon_core.identity).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tuimon_core.findings import Finding
from tuimon_core.hostlist import collect_hostlist
from tuimon_core.link_rules import bandwidth, link_text, path_most
from tuimon_core.protocol.row_access import port_info_rows

MIN_NODES = 3


def _gbps(rate: float) -> str:
    return f"{rate * 8 / 1e9:g} Gb/s"


def _gpu_models(h: Any) -> list[tuple[str, Any]]:
    return [(g.name or "?", g) for g in h.gpus]


def _per_model(h: Any, value: Callable[[Any], Any]) -> dict[str, Any]:
    """A node's value of each GPU model (the lowest of its GPUs: the slowest link)."""
    out: dict[str, Any] = {}
    for model, g in _gpu_models(h):
        v = value(g)
        if v is not None:
            out[model] = v if model not in out else min(out[model], v)
    return out


def _hca_devices(h: Any, key: str, only_up: bool = False) -> dict[str, dict[str, Any]]:
    """A node's HCAs by model and link layer (`MT4126 InfiniBand`), each device with its
    value. The link layer is part of the key: one CA type serves Ethernet and InfiniBand
    HCAs on one host (an A100 node's Ethernet mlx5_0 and eight InfiniBand HCAs are all
    MT4126), on firmware of different lines, and one firmware per model hid the others.
    `only_up` leaves out ports that are not ACTIVE and LinkUp (`up` 0): their rate is
    none (a Down port reads `40`), and their link_down says the rest."""
    out: dict[str, dict[str, Any]] = {}
    for p in port_info_rows(h):
        model, v = p.get("hca_type"), p.get(key)
        if not model or v is None or (only_up and p.get("up") == 0):
            continue
        layer = p.get("link_layer")
        device = str(p.get("device") or p.get("id") or "?")
        out.setdefault(f"{model} {layer}" if layer else model, {})[device] = v
    return out


def _slowest(values: Iterable[Any]) -> Any:
    return min(values)


def _distinct(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(sorted(set(values), key=str))


def _versions(value: Any) -> str:
    return " and ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _path(hops: Any) -> tuple[float, int | None, int | None] | None:
    """What a device's PCIe path lets through at most, ordered by bandwidth (the lowest
    of a node's devices of a model is its slowest)."""
    most = path_most(hops)
    return None if most is None else (bandwidth(most) or 0.0, *most)


def _paths(h: Any) -> dict[str, Any]:
    """Each GPU and HCA model's narrowest PCIe path on the node (the models' names do
    not meet: `NVIDIA H100 80GB HBM3`, `MT4129`)."""
    out = _per_model(h, lambda g: _path(g.pcie_path))
    for port in port_info_rows(h):
        model, v = port.get("hca_type"), _path(port.get("pcie_path"))
        if model and v is not None:
            out[model] = min(out.get(model, v), v)
    return out


@dataclass(frozen=True)
class Aspect:
    """One thing nodes are compared by: its name, how a node's hello gives it (a value,
    or a value per model of GPU or HCA), and how a value is said. An HCA aspect also
    gives each device's own value (`devices`), so a finding can name the devices that
    differ, and `read` folds them into the node's value."""

    key: str
    label: str
    read: Callable[[Any], Any]
    per_model: bool = False
    show: Callable[[Any], str] = str
    devices: Callable[[Any], dict[str, dict[str, Any]]] | None = None


def _hca_aspect(key: str, label: str, field: str, fold: Callable[[Iterable[Any]], Any],
                show: Callable[[Any], str] = str, only_up: bool = False) -> Aspect:
    def devices(h: Any) -> dict[str, dict[str, Any]]:
        return _hca_devices(h, field, only_up)

    return Aspect(key, label, lambda h: {m: fold(d.values()) for m, d in devices(h).items()},
                  per_model=True, show=show, devices=devices)


ASPECTS: tuple[Aspect, ...] = (
    Aspect("driver", "driver", lambda h: h.driver_version),
    Aspect("cuda", "CUDA", lambda h: h.extra.get("cuda_driver_version")),
    Aspect("kernel", "kernel", lambda h: (h.host or {}).get("kernel")),
    # Per model: a partition of other GPUs is the fleet's design, 7 where 8 are is not.
    Aspect("gpus", "GPUs", lambda h: dict(Counter(m for m, _ in _gpu_models(h))),
           per_model=True),
    Aspect("vbios", "VBIOS", lambda h: _per_model(h, lambda g: g.vbios), per_model=True),
    Aspect("nvlinks", "NVLinks active", lambda h: _per_model(h, lambda g: g.nvlinks),
           per_model=True),
    # Every device's firmware, not one per model: a node whose HCAs run two versions
    # differs from one whose HCAs all run one.
    _hca_aspect("hca_fw", "HCA firmware", "fw_ver", _distinct, show=_versions),
    # The slowest up port: a rail-optimised all-reduce runs at its pace.
    _hca_aspect("port_rate", "port rate", "rate", _slowest, show=_gbps, only_up=True),
    # What the links from each GPU or HCA to its root port allow at most: a node whose
    # GPUs sit in Gen4 slots where the fleet's are in Gen5 ones (agents since 2026-12).
    Aspect("pcie_path", "PCIe path", _paths, per_model=True,
           show=lambda v: link_text(v[1:])),
)


@dataclass(frozen=True)
class Group:
    value: Any
    nodes: tuple[str, ...]


def _values(hellos: Mapping[str, Any], aspect: Aspect) -> dict[str, dict[str, Any]]:
    """model ('' when the aspect is not per model) -> node -> value."""
    out: dict[str, dict[str, Any]] = {}
    for node, h in hellos.items():
        try:
            value = aspect.read(h)
        except (AttributeError, TypeError):
            continue  # a hello without these facts (an older agent, Prometheus)
        if aspect.per_model:
            for model, v in (value or {}).items():
                out.setdefault(model, {})[node] = v
        elif value is not None:
            out.setdefault("", {})[node] = value
    return out


def fleet_table(hellos: Mapping[str, Any]) -> list[tuple[Aspect, str, list[Group]]]:
    """Every aspect, by model, with the nodes grouped by value, the most common first:
    what the fleet screen shows."""
    out = []
    for aspect in ASPECTS:
        for model, by_node in sorted(_values(hellos, aspect).items()):
            groups: dict[Any, list[str]] = {}
            for node, v in by_node.items():
                groups.setdefault(v, []).append(node)
            ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), str(kv[0])))
            out.append((aspect, model, [Group(v, tuple(sorted(n))) for v, n in ordered]))
    return out


def _odd_devices(hellos: Mapping[str, Any], aspect: Aspect, model: str, group: Group,
                 usual: Any) -> str:
    """The devices of a group's nodes whose own value is not the usual one, as a host
    list (`mlx5_[1-8]`), for an aspect that has devices; else nothing."""
    if aspect.devices is None:
        return ""
    usual_values = set(usual) if isinstance(usual, tuple) else {usual}
    names: set[str] = set()
    for node in group.nodes:
        try:
            mine = aspect.devices(hellos[node]).get(model) or {}
        except (AttributeError, TypeError):
            continue
        names.update(d for d, v in mine.items() if v not in usual_values)
    return collect_hostlist(sorted(names)) if names else ""


def _said(aspect: Aspect, groups: list[Group],
          devices: Callable[[Group], str] = lambda g: "") -> str:
    out = []
    for g in groups:
        count = f"{len(g.nodes)} node{'s' if len(g.nodes) != 1 else ''}"
        named = devices(g)
        out.append(f"{aspect.show(g.value)} on {collect_hostlist(g.nodes)} "
                   f"({count}{': ' + named if named else ''})")
    return "; ".join(out)


def fleet_findings(hellos: Mapping[str, Any]) -> list[Finding]:
    """The nodes that differ from the usual value of the fleet, an aspect at a time; or
    every group, where no value is the usual one (a tie)."""
    out = []
    for aspect, model, groups in fleet_table(hellos):
        total = sum(len(g.nodes) for g in groups)
        if len(groups) < 2 or total < MIN_NODES:
            continue
        what = f"{aspect.label}{f' ({model})' if model else ''}"
        target = f"{aspect.key}:{model}"
        if len(groups[0].nodes) == len(groups[1].nodes):  # no usual value: a split fleet
            out.append(Finding("warning", "fleet_skew",
                               f"{what}: split, no value on most nodes: "
                               f"{_said(aspect, groups)}", target=target,
                               nodes=tuple(n for g in groups for n in g.nodes), score=0.3))
            continue
        usual, odd = groups[0], groups[1:]

        def devices(g: Group, aspect: Aspect = aspect, model: str = model,
                    usual: Group = usual) -> str:
            return _odd_devices(hellos, aspect, model, g, usual.value)

        out.append(Finding("warning", "fleet_skew",
                           f"{what}: {_said(aspect, odd, devices)}; "
                           f"{aspect.show(usual.value)} on {len(usual.nodes)}", target=target,
                           nodes=tuple(n for g in odd for n in g.nodes), score=0.3))
    return out


def hellos_of(nodes: Iterable[tuple[str, Any]],
              leave_out: frozenset[str] = frozenset()) -> dict[str, Any]:
    """node name -> hello, for the nodes that have one. Nodes named as CPU nodes (login
    and service nodes) are left out: they are not the training fleet, and their other
    kernel or missing GPUs say nothing about a compute node."""
    return {name: h for name, h in nodes if h is not None and name not in leave_out}
