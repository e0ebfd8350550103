"""What a judgement is judged with, from the options every front end takes alike (the
app, `status`, `--once`, the relay): the topology (leaf switch of each node), the file
systems' provisioned throughput, the SLO and the jobs' baselines, the CPU nodes. One
parser of each option and one builder of the judgement, so a relay judges a cluster
exactly as a viewer given the same options would."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.judgement import Judgement
from tuimon.model.slo import DEFAULT_HOURS, DEFAULT_TARGET, Slo
from tuimon.model.storage import StorageView
from tuimon.model.view_state import parse_topology_conf
from tuimon_core.cli_types import positive_float, slo_target
from tuimon_core.hostlist import TargetError, expand_hostlist, expand_hostlists

_RATE_UNITS = {"": 1e9, "g": 1e9, "gb": 1e9, "gb/s": 1e9, "t": 1e12, "tb": 1e12,
               "tb/s": 1e12, "m": 1e6, "mb": 1e6, "mb/s": 1e6, "gib/s": 2**30,
               "tib/s": 2**40}


def add_judge_options(p: argparse.ArgumentParser) -> None:
    """--topology, --provisioned, --cpu-nodes: what the cluster rules judge with."""
    p.add_argument("--topology", metavar="F",
                   help="Slurm topology.conf: group nodes by leaf switch (the fabric map, "
                        "congestion by leaf and spine)")
    p.add_argument("--provisioned", action="append", default=[], metavar="MOUNT=RATE",
                   help="provisioned throughput of a shared file system, e.g. "
                        "/lustre/scratch=400GB/s")
    p.add_argument("--cpu-nodes", metavar="HOSTLIST", default="",
                   help="nodes known to have no GPU (login nodes): no GPU there is no fault")


def add_slo_options(p: argparse.ArgumentParser, hours: bool = True, jobs: bool = True) -> None:
    """--slo-target, --slo-hours (unless the caller has its own), and unless `jobs` is
    false (a command that judges no throughput), --baseline, --flops-per-sample."""
    p.add_argument("--slo-target", type=slo_target, default=DEFAULT_TARGET,
                   help="SLO target for the effective training time ratio (default "
                        f"{DEFAULT_TARGET:.2f})")
    if hours:
        p.add_argument("--slo-hours", type=positive_float(1e6), default=DEFAULT_HOURS,
                       help="SLO window: the run's planned hours or rolling days x 24 "
                            f"({DEFAULT_HOURS:.0f})")
    if not jobs:
        return
    p.add_argument("--baseline", action="append", default=[], metavar="JOB=SAMPLES/S",
                   help="single-GPU throughput of a job, for scaling efficiency")
    p.add_argument("--flops-per-sample", action="append", default=[], metavar="JOB=FLOPS",
                   help="model FLOPs per sample of a job, for MFU against the GPUs' peak")


def job_values(items: list[str], option: str, unit: str) -> dict[str, float]:
    """`JOB=VALUE` items (positive numbers)."""
    out = {}
    for item in items:
        job, sep, value = item.rpartition("=")
        try:
            out[job] = float(value)
        except ValueError:
            raise TargetError(f"{option} {item!r}: expected JOB={unit}") from None
        if not sep or not job or out[job] <= 0:
            raise TargetError(f"{option} {item!r}: expected JOB={unit}")
    return out


def slo_of(args: argparse.Namespace) -> tuple[Slo, dict[str, float], dict[str, float]]:
    """(the SLO, the jobs' baselines, their FLOPs per sample) from the options."""
    return (Slo(args.slo_target, args.slo_hours),
            job_values(args.baseline, "--baseline", "SAMPLES/S"),
            job_values(args.flops_per_sample, "--flops-per-sample", "FLOPS"))


def provisioned(items: list[str]) -> dict[str, float]:
    """`MOUNT=400`, `MOUNT=400GB/s`, `MOUNT=3.2 TB/s`, `MOUNT=500MB/s` (default GB/s)."""
    out = {}
    for item in items:
        mount, sep, value = item.rpartition("=")
        m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z/]*)\s*", value)
        scale = _RATE_UNITS.get(m.group(2).lower()) if m else None
        if not sep or not mount or m is None or scale is None:
            raise TargetError(f"--provisioned {item!r}: expected MOUNT=RATE, e.g. "
                              "/lustre/scratch=400GB/s (GB/s, TB/s or MB/s; GB/s if none)")
        try:
            out[mount] = float(m.group(1)) * scale
        except ValueError:
            raise TargetError(f"--provisioned {item!r}: {m.group(1)!r} is not a number") from None
    return out


def topology(path: str | None, leaves: dict[str, str] | None = None) -> dict[str, str]:
    """node -> leaf switch: a Slurm topology.conf (`--topology`), and the config file's
    `leaves` (leaf -> host list), which win."""
    inline = {}
    leaves = leaves or {}
    expand_hostlists(str(h) for h in leaves.values())  # counted together, before expanding
    for leaf, hosts in leaves.items():
        for name in expand_hostlist(str(hosts)):
            inline[name] = leaf
    if not path:
        return inline
    try:
        return {**parse_topology_conf(Path(path).read_text()), **inline}
    except OSError as exc:
        raise TargetError(f"--topology {path}: {exc.strerror or exc}") from None
    except TargetError as exc:
        raise TargetError(f"--topology {path}: {exc}") from None


def cpu_nodes(args: argparse.Namespace) -> frozenset[str]:
    text = getattr(args, "cpu_nodes", "") or ""
    return frozenset(expand_hostlists([text])) if text else frozenset()


@dataclass(frozen=True)
class JudgeConfig:
    """Everything a judgement takes besides the cluster it judges."""

    topology: dict[str, str] = field(default_factory=dict)
    provisioned: dict[str, float] = field(default_factory=dict)
    slo: Slo = field(default_factory=lambda: Slo(DEFAULT_TARGET, DEFAULT_HOURS))
    baselines: dict[str, float] = field(default_factory=dict)
    flops_per_sample: dict[str, float] = field(default_factory=dict)
    cpu_nodes: frozenset[str] = frozenset()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> JudgeConfig:
        slo, baselines, flops = slo_of(args)
        return cls(topology(getattr(args, "topology", None), getattr(args, "leaves", None)),
                   provisioned(getattr(args, "provisioned", None) or []), slo, baselines,
                   flops, cpu_nodes(args))

    def judgement(self, cluster: ClusterState,
                  wall: Callable[[], float] | None = None, **diagnosis: Any) -> Judgement:
        """A judgement of `cluster` on the clock `wall` (Unix time: a replay's or the
        demo's own where given): the one builder of every front end's (the app's,
        status's, a readout's, the relay's, `prom --serve`'s)."""
        clock = wall or time.time
        return Judgement(cluster, StorageView(self.provisioned),
                         EfficiencyView(self.slo, self.baselines, wall=clock,
                                        flops_per_sample=self.flops_per_sample),
                         Diagnosis(self.topology, wall=clock, cpu_nodes=self.cpu_nodes,
                                   **diagnosis))
