"""Which machine a Prometheus series belongs to, whatever exporter wrote it.

Exporters name the machine differently: tuimon's agent by `node`, dcgm-exporter by
`Hostname` (2.x to 4.x; `hostname` in newer builds), which is the node's name on bare
metal but the exporter pod's or container's name in some Kubernetes and Docker
deployments; node_exporter by its scrape address `instance` (often an IP and port), with
the real host name in `node_uname_info{nodename}`. So one GPU node would show as two (its
GPUs under one name, its InfiniBand ports and NFS mounts under another). The order:

1. the labels given with `--node-label` (or `node_labels` in the config), in order;
2. `node`, `kubernetes_node`, `node_name` (tuimon's agent; Kubernetes relabelling of
   `__meta_kubernetes_pod_node_name`, which is how a pod-network exporter is joined);
3. `Hostname` or `hostname`, unless it names a pod or container (equal to the series'
   `pod` label, a 12 or 64 hex character container id, or an exporter DaemonSet pod name
   such as `nvidia-dcgm-exporter-ml2wh`);
4. the host part of `instance`, replaced by node_exporter's `nodename` for the same
   host (its `node_uname_info`), so dcgm-exporter on `10.0.0.5:9400` and node_exporter
   on `10.0.0.5:9100` are one node; a host whose target answers with several
   `nodename`s (one target for many machines: federation, an exporter proxy) is named
   by none of them;
5. finally `--node-alias OLD=NEW` (`node_aliases` in the config) renames what is left,
   and a fully qualified name becomes its short form when that short form is a node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable

BUILTIN_LABELS = ("node", "kubernetes_node", "node_name")
HOSTNAME_LABELS = ("Hostname", "hostname")
_CONTAINER_ID = re.compile(r"[0-9a-f]{12}|[0-9a-f]{64}")
_EXPORTER_POD = re.compile(r".*(dcgm|exporter).*-[a-z0-9]{5}")
_IP = re.compile(r"[0-9.]+|.*:.*")


def identity_labels(first: Iterable[str] = ()) -> tuple[str, ...]:
    """Every label the rules above read: what an aggregated query keeps (`max by`) so
    each series still says whose it is, and nothing more."""
    return tuple(dict.fromkeys((*first, *BUILTIN_LABELS, *HOSTNAME_LABELS, "instance",
                                "pod")))


def identity_key(ids: tuple[str, ...]) -> Callable[[dict[str, str]], tuple[str | None, ...]]:
    """A series' identity labels' values, as one key: `tuple(map(labels.get, ids))`, in
    less than half its time (asked once per series: a quarter of a million a refresh at
    4096 nodes). The names are written into the function as string literals (repr)."""
    body = "".join(f"g(labels, {name!r}), " for name in ids)
    return eval(f"lambda labels, g=dict.get: ({body})")


def quoted(value: str) -> str:
    """A PromQL string: JSON's escapes are Go's (a newline in a label value included)."""
    return json.dumps(value, ensure_ascii=False)


def instance_host(instance: str | None) -> str | None:
    if not instance:
        return None
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    return instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance


def names_a_pod(value: str, labels: dict[str, str]) -> bool:
    return (value == labels.get("pod") or bool(_CONTAINER_ID.fullmatch(value))
            or bool(_EXPORTER_POD.fullmatch(value)))


class NodeNames:
    """The resolver for one refresh: learn node_exporter's host names, then name series."""

    def __init__(self, labels: Iterable[str] = (), aliases: dict[str, str] | None = None) -> None:
        self.labels = tuple(labels)
        self.aliases = dict(aliases or {})
        self._by_host: dict[str, str] = {}
        self._ids = identity_labels(self.labels)
        self.identity_key = identity_key(self._ids)
        # The identity labels' values -> (name, label it came from): a refresh names the
        # same few thousand machines from hundreds of thousands of series.
        self._seen: dict[tuple[str | None, ...], tuple[str | None, str | None]] = {}

    def learn_uname(self, series: Iterable[tuple[dict[str, str], float]]) -> None:
        self._seen.clear()  # names read before may change with what is learnt here
        names: dict[str, set[str]] = {}
        for labels, _ in series:
            host = instance_host(labels.get("instance"))
            name = labels.get("nodename")
            if host and name:
                names.setdefault(host, set()).add(name)
        for host, found in names.items():
            if len(found) == 1:
                self._by_host[host] = next(iter(found))
            else:
                # One target answering for many machines (federation, an exporter
                # proxy, a Kubernetes layout): its host names none of them, and what only
                # it names (its failed scrape) stays the target's.
                self._by_host.pop(host, None)

    @property
    def identity(self) -> tuple[str, ...]:
        """The labels whose values name a series' machine (identity_labels)."""
        return self._ids

    @property
    def hosts(self) -> dict[str, str]:
        """What node_exporter's host names taught: host -> node name."""
        return self._by_host

    def of(self, labels: dict[str, str]) -> str | None:
        name = self._named(labels)[0]
        return self.aliases.get(name, name) if name is not None else None

    def matcher(self, labels: dict[str, str]) -> str | None:
        """A PromQL label matcher selecting the series of the machine these labels name,
        by the label that named it (`Hostname="gpu001"`)."""
        key = self._named(labels)[1]
        return None if key is None else f"{key}={quoted(labels[key])}"

    def _named(self, labels: dict[str, str]) -> tuple[str | None, str | None]:
        key = self.identity_key(labels)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = self._raw(labels)
        return found

    def _raw(self, labels: dict[str, str]) -> tuple[str | None, str | None]:
        """(the name, the label it came from)."""
        for key in (*self.labels, *BUILTIN_LABELS):
            if labels.get(key):
                return labels[key], key
        for key in HOSTNAME_LABELS:
            value = labels.get(key)
            if value and not names_a_pod(value, labels):
                return value, key
        host = instance_host(labels.get("instance"))
        if host is None:
            return None, None
        return self._by_host.get(host, host), "instance"

    @staticmethod
    def short_forms(names: Iterable[str]) -> dict[str, str]:
        """`gpu001.cluster.local` -> `gpu001` where `gpu001` is itself a node name."""
        names = set(names)
        out = {}
        for name in names:
            if "." in name and not _IP.fullmatch(name):
                short = name.split(".", 1)[0]
                if short in names:
                    out[name] = short
        return out
