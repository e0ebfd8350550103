"""`--cluster NAME`: a cluster from the config file, read before the real parse so that
its settings are the parser's defaults; alone, it implies the command that watches it
(`connect`, or `prom` where the file names only a Prometheus server), and it gives the
targets the command line does not."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuimon.config import ClusterConfig
from tuimon.sources.targets import TargetError


def cluster_of(argv: list[str]) -> ClusterConfig | None:
    """The cluster named by --cluster (and --config), read before the real parse so that
    its settings can be the parser's defaults."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--cluster")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if not known.cluster:
        return None
    from tuimon import config

    path = Path(known.config).expanduser() if known.config else None
    if path is not None and not path.exists():
        raise TargetError(f"--config {known.config}: file not found")
    clusters = config.load(path)
    if known.cluster not in clusters:
        names = ", ".join(sorted(clusters)) or "none"
        raise TargetError(f"no cluster {known.cluster!r} in "
                          f"{path or config.default_path()} (clusters: {names})")
    return clusters[known.cluster]


def implicit_command(argv: list[str], cluster: ClusterConfig) -> list[str]:
    """The global options, then the command the cluster's config implies, then the rest
    (which are that command's options)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--cluster")
    pre.add_argument("--config")
    pre.add_argument("--debug", action="store_true")
    known, rest = pre.parse_known_args(argv)
    front = ["--cluster", known.cluster] + (["--config", known.config] if known.config
                                            else []) + (["--debug"] if known.debug else [])
    if cluster.prometheus and not (cluster.targets or cluster.relay):
        return [*front, "prom", cluster.prometheus, *rest]
    return [*front, "connect", *rest]


def fill_targets(args: argparse.Namespace, c: ClusterConfig) -> None:
    """Targets typed on the command line replace the cluster's targets and relay; with
    none typed, the cluster's are used."""
    if args.command == "report":
        args.relay = args.relay or c.relay  # the ledger a cluster's relay keeps
        return
    if args.command not in ("connect", "status"):
        return  # the relay has its own targets; the config file describes what you watch
    if not args.targets and not args.relay and not getattr(args, "prometheus", None):
        args.targets = list(c.targets)
        args.relay = [c.relay] if c.relay else []
        if args.command == "status" and not (args.targets or args.relay) and c.prometheus:
            args.prometheus = c.prometheus  # a cluster watched through Prometheus
