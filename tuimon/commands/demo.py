"""`tuimon demo`: simulate a cluster on loopback (agent.sim) and watch it, in the app,
`--plain` or `--once`, a scenario's fault where asked."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING

from agent.sim.limits import MAX_GPUS, MAX_NODES
from agent.sim.scenarios import add_scenario_options
from tuimon.commands.options import view_options
from tuimon.commands.run_app import agent_feed, app_or_readout, run_app, watch
from tuimon.model.cluster import ClusterState
from tuimon.model.judge_config import JudgeConfig, add_slo_options
from tuimon.sources.agent_stream import StreamOptions
from tuimon_core.cli_types import positive_int
from tuimon_core.user_files import write_file

if TYPE_CHECKING:
    from agent.sim.cluster import SimCluster


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=positive_int(MAX_NODES), default=32,
                   help=f"simulated nodes (default 32, at most {MAX_NODES})")
    p.add_argument("--gpus", type=positive_int(MAX_GPUS, least=0), default=8,
                   help=f"GPUs a node (default 8, at most {MAX_GPUS}; 0: CPU-only nodes)")
    p.add_argument("--seed", type=int, default=0,
                   help="the simulation's random seed: one seed, one run (default 0)")
    p.add_argument("--base-port", type=int, default=19400, metavar="P",
                   help="node i listens on 127.0.0.1:(P+i) (default 19400)")
    view_options(p)
    add_slo_options(p)
    add_scenario_options(p)


def run(args: argparse.Namespace) -> int:
    return app_or_readout(args, _app, _readout)


def _sim(args: argparse.Namespace) -> SimCluster:
    """The simulated cluster the options describe, on free ports (said where the asked
    ones are taken)."""
    from agent.sim.cluster import SimCluster, free_port_block

    base = free_port_block("127.0.0.1", args.base_port, args.nodes)
    if base != args.base_port:
        print(f"tuimon demo: ports {args.base_port}-{args.base_port + args.nodes - 1} are in "
              f"use (another demo?); the simulated nodes listen on {base}-"
              f"{base + args.nodes - 1}", file=sys.stderr)
        args.base_port = base
    return SimCluster(nodes=args.nodes, gpus=args.gpus, base_port=args.base_port,
                      seed=args.seed, scenario=args.scenario, fault_at=args.fault_at,
                      speed=args.speed)


def _app(args: argparse.Namespace) -> int:
    from agent.sim.io_model import LUSTRE_MOUNT

    sim = _sim(args)
    if args.truth:
        write_file(args.truth, json.dumps(sim.truth(), indent=2) + "\n", "--truth")
    judge = dataclasses.replace(_judge_config(args, sim),
                                provisioned={LUSTRE_MOUNT: sim.lustre_provisioned})
    cluster = ClusterState(f"demo: {args.nodes} simulated nodes")
    for t in sim.targets:
        cluster.add_target(t)
    return run_app(cluster, agent_feed(sim.targets, StreamOptions(overview=True)),
                   args.theme, judge, before=sim.start, after=sim.stop, record=args.record,
                   wall=sim.wall, ascii_only=args.ascii)


async def _readout(args: argparse.Namespace) -> int:
    cluster = _sim(args)
    async with cluster:
        state = ClusterState(f"demo ({args.nodes} simulated nodes)")
        judge = _judge_config(args, cluster).judgement(state, wall=cluster.wall)
        return await watch(state, agent_feed(cluster.targets, StreamOptions()), args.once,
                           judge)


def _judge_config(args: argparse.Namespace, sim: SimCluster) -> JudgeConfig:
    """The SLO and baselines the options give, the simulation's leaf switches."""
    return dataclasses.replace(JudgeConfig.from_args(args),
                               topology={m.name: sim.leaf_of(m.index) for m in sim.members})
