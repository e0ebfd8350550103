"""Named fault scenarios for the simulator, with their ground truth.

Each scenario says which nodes get which trouble from the onset (`--fault-at` seconds
after start), how the job's all-reduce and I/O suffer, and which components a correct
diagnosis names (`--truth FILE` writes them as JSON).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.sim.io_model import LUSTRE_MOUNT, IoTrouble
from agent.sim.limits import MAX_SPEED
from agent.sim.workload import NodeTrouble, troubles_for
from tuimon_core.cli_types import positive_float

SCENARIOS = ("mixed", "healthy", "spine-imbalance", "thermal-straggler", "checkpoint-storm",
             "xid-79", "link-flap", "bad-cable", "hot-node", "pcie-downtrain",
             "switch-downtrained", "nvlink-degraded", "driver-skew", "gpu-missing",
             "pfc-storm", "power-brake", "nvlink-lost", "nvml-missing", "lossless-drops",
             "port-disabled")
# A rank whose GPU's link is slow computes this much longer: copies in and out of the
# GPU wait on the link (a Gen3 x8 link has a quarter of Gen5 x16's bandwidth).
GRAY_SLOWDOWN = 1.15
# A GPU held at a twentieth of its clock computes many times longer; the job waits on it.
BRAKED_SLOWDOWN = 3.0
OTHER_DRIVER = "535.129.03"
# The seed incident: a badly cabled spine took the job from 92 % to 68 % efficiency.
SPINE_ALLREDUCE_FACTOR = 5.5


@dataclass
class Scenario:
    name: str
    troubles: dict[int, NodeTrouble] = field(default_factory=dict)
    allreduce_factor: float = 1.0  # once the fault is on
    io_stall_s: float = 0.0
    components: list[str] = field(default_factory=list)  # what a diagnosis must name
    kinds: list[str] = field(default_factory=list)  # which findings name them
    roce: bool = False  # the cluster's fabric is RoCE (Ethernet ports, PFC)
    restart: list[int] = field(default_factory=list)  # nodes whose agent restarts at onset
    # There when the nodes start (how they were imaged), whatever --fault-at says: the
    # truth's onset is the start.
    from_start: bool = False


def build(name: str, nodes: int, gpus: int, seed: int, nodes_per_leaf: int,
          node_name: Callable[[int], str], leaf_of: Callable[[int], str]) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; scenarios: {', '.join(SCENARIOS)}")
    rng = random.Random(seed * 31 + nodes)
    victim = rng.randrange(nodes)
    gpu = rng.randrange(max(1, gpus))
    if name == "mixed":  # something of everything, from the start: the feature tour
        troubles = troubles_for(nodes, seed, nodes_per_leaf)
        congested = any(t.io.congested for t in troubles.values())
        return Scenario(name, troubles, 2.8 if congested else 1.0)
    if name == "healthy":
        return Scenario(name)
    if name == "spine-imbalance":
        leaf_index = rng.randrange(max(1, nodes // nodes_per_leaf))
        members = range(leaf_index * nodes_per_leaf, min(nodes, (leaf_index + 1) *
                                                        nodes_per_leaf))
        troubles = {i: NodeTrouble(io=IoTrouble(congested=True)) for i in members}
        return Scenario(name, troubles, SPINE_ALLREDUCE_FACTOR,
                        components=[leaf_of(leaf_index * nodes_per_leaf)],
                        kinds=["congestion"])
    if name == "thermal-straggler":
        return Scenario(name, {victim: NodeTrouble(hot_gpu=gpu, slow_gpu=gpu, slow=1.15)},
                        components=[f"{node_name(victim)} GPU {gpu}"],
                        kinds=["thermal", "straggler"])
    if name == "checkpoint-storm":
        troubles = {i: NodeTrouble(io=IoTrouble(checkpoint_storm=True)) for i in range(nodes)}
        return Scenario(name, troubles, io_stall_s=0.45, components=[LUSTRE_MOUNT],
                        kinds=["storage"])
    if name == "xid-79":
        return Scenario(name, {victim: NodeTrouble(lost_gpu=gpu)},
                        components=[f"{node_name(victim)} GPU {gpu}"],
                        kinds=["gpu_failed", "xid"])
    if name == "pcie-downtrain":  # one GPU's link at Gen3 x8 while busy: its rank straggles
        return Scenario(name, {victim: NodeTrouble(pcie_gpu=gpu, slow_gpu=gpu,
                                                   slow=GRAY_SLOWDOWN)},
                        components=[f"{node_name(victim)} GPU {gpu}"],
                        kinds=["pcie_downtrained", "straggler"])
    if name == "switch-downtrained":  # the switch above one GPU trains to its root at Gen4
        return Scenario(name, {victim: NodeTrouble(switch_gpu=gpu, slow_gpu=gpu,
                                                   slow=GRAY_SLOWDOWN)},
                        components=[f"{node_name(victim)} GPU {gpu}"],
                        kinds=["pcie_downtrained", "straggler"])
    if name == "nvlink-degraded":  # six NVLinks down, the rest retraining now and then
        return Scenario(name, {victim: NodeTrouble(nvlink_gpu=gpu, slow_gpu=gpu,
                                                   slow=GRAY_SLOWDOWN)},
                        components=[f"{node_name(victim)} GPU {gpu}"],
                        kinds=["nvlink_down", "straggler"])
    if name == "driver-skew":  # two nodes on another driver since they were imaged
        pair = [victim, (victim + 1) % nodes] if nodes > 2 else [victim]
        return Scenario(name, {i: NodeTrouble(driver=OTHER_DRIVER) for i in pair},
                        components=[node_name(i) for i in pair], kinds=["fleet_skew"],
                        from_start=True)
    if name == "gpu-missing":  # a GPU leaves NVML and stays on the PCI bus
        return Scenario(name, {victim: NodeTrouble(missing_gpu=gpu)},
                        components=[node_name(victim)], kinds=["gpu_missing"])
    if name == "power-brake":  # the node's power brake asserted: every clock collapses
        return Scenario(name, {victim: NodeTrouble(power_brake=True, slow=BRAKED_SLOWDOWN)},
                        components=[node_name(victim)], kinds=["hw_slowdown", "straggler"])
    if name == "nvlink-lost":  # one more link of a GPU goes down: judged against its past
        return Scenario(name, {victim: NodeTrouble(nvlink_lost_gpu=gpu, slow_gpu=gpu,
                                                   slow=GRAY_SLOWDOWN)},
                        components=[f"{node_name(victim)} GPU {gpu}"],
                        kinds=["nvlink_down", "straggler"])
    if name == "nvml-missing":  # after a driver upgrade the agent restarts without NVML
        return Scenario(name, {victim: NodeTrouble(nvml_missing=True)},
                        components=[node_name(victim)], kinds=["gpu_missing"],
                        restart=[victim])
    port = rng.randrange(max(1, gpus))
    if name == "pfc-storm":  # RoCE: one port's receiver cannot keep up and pauses its peer
        return Scenario(name, {victim: NodeTrouble(io=IoTrouble(pfc_port=port))},
                        allreduce_factor=1.6, components=[f"{node_name(victim)} mlx5_{port}:1"],
                        kinds=["pfc_pausing", "pfc_storm"], roce=True)
    if name == "lossless-drops":  # RoCE: one port drops its PFC priority's packets
        return Scenario(name, {victim: NodeTrouble(io=IoTrouble(drop_port=port))},
                        allreduce_factor=1.3, components=[f"{node_name(victim)} mlx5_{port}:1"],
                        kinds=["port_drops"], roce=True)
    if name == "port-disabled":  # someone disables a port that carried the job's traffic
        return Scenario(name, {victim: NodeTrouble(io=IoTrouble(disabled_port=port))},
                        components=[f"{node_name(victim)} mlx5_{port}:1"],
                        kinds=["port_disabled"])
    if name == "bad-cable":  # symbol errors climbing steadily, the link never drops
        return Scenario(name, {victim: NodeTrouble(io=IoTrouble(
            symbol_errors_port=port, symbol_errors_per_s=500.0))},
            components=[f"{node_name(victim)} mlx5_{port}:1"], kinds=["symbol_errors"])
    if name == "hot-node":  # two of one node's ports starved of credits, no topology needed
        hot = (port, (port + 1) % max(1, gpus))
        return Scenario(name, {victim: NodeTrouble(io=IoTrouble(hot_ports=hot))},
                        components=[node_name(victim)], kinds=["congestion"])
    # link-flap
    return Scenario(name, {victim: NodeTrouble(io=IoTrouble(flapping_port=port,
                                                            symbol_errors_port=port))},
                    components=[f"{node_name(victim)} mlx5_{port}:1"],
                    kinds=["link_down", "flapping", "symbol_errors"])


def add_scenario_options(p: argparse.ArgumentParser) -> None:
    """--scenario, --fault-at, --truth, --speed: for `tuimon-agent sim` and `tuimon demo`."""
    p.add_argument("--scenario", default="mixed", choices=SCENARIOS, metavar="NAME",
                   help="fault to simulate: " + ", ".join(SCENARIOS) + " (default: mixed, a "
                        "bit of everything from the start)")
    p.add_argument("--fault-at", type=float, default=60.0, metavar="SECONDS",
                   help="seconds after start when the scenario's fault begins (default 60)")
    p.add_argument("--truth", metavar="FILE",
                   help="write the ground truth (scenario, onset, components) as JSON")
    p.add_argument("--speed", type=positive_float(MAX_SPEED), default=1.0, metavar="X",
                   help="simulated seconds per real second (e.g. 60: an hour a minute)")
