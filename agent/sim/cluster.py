"""Run many simulated nodes in one process, each a real agent on its own port.

Node i is served at 127.0.0.1:(base_port + i) by the same `NodeAgent` and aiohttp app
a real node runs; only the NVML module and the /proc files under it are simulated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from agent.collectors.storage import StorageConfig
from agent.files import GeneratedTree
from agent.node import AgentConfig, NodeAgent
from agent.server import build_app
from agent.sim import scenarios
from agent.sim.fake_nvml import FakeNvml
from agent.sim.limits import MAX_GPUS, MAX_NODES, MAX_SPEED
from agent.sim.steps_model import FabricState, RankPlan, SimJob
from agent.sim.workload import NodeTrouble, SimNodeModel
from tuimon_core.errors import UsageError

log = logging.getLogger(__name__)


class SimConfigError(UsageError, ValueError):
    """A simulated cluster that cannot be built as asked: the message names the option."""


@dataclass
class SimNode:
    index: int
    name: str
    port: int
    model: SimNodeModel
    agent: NodeAgent
    runner: web.AppRunner | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def _nvml_of(model: SimNodeModel) -> Callable[[], object]:
    """The node agent's NVML loader: the simulated node's NVML, or one whose library
    cannot be loaded where the scenario took it away (its GPUs stay on the PCI bus)."""
    return lambda: FakeNvml(0, driver=False) if model.active().nvml_missing else model.nvml


def _slowdown_of(member: SimNode, gpu: int) -> Callable[[], float]:
    """A rank's compute multiplier now, as its simulated GPU says."""
    return lambda: member.model.rank_slowdown(gpu)


@dataclass
class SimCluster:
    """A simulated cluster; `start()` opens every node's port, `stop()` closes them."""

    nodes: int = 4
    gpus: int = 8
    base_port: int = 19400
    seed: int = 0
    interval: float = 1.0
    host: str = "127.0.0.1"
    name_prefix: str = "sim-node"
    token: str | None = None
    nodes_per_leaf: int = 8
    spines: int = 2
    # Provisioned throughput of the shared Lustre file system, bytes/s (both directions).
    lustre_provisioned: float = 400e9
    # Monotonic and wall clocks; tests give fixed ones to replay a seeded cluster exactly.
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    scenario: str = "mixed"
    fault_at: float = 0.0  # seconds after the cluster is made (simulated seconds)
    # Simulated seconds per real second: hours of error budget in minutes.
    speed: float = 1.0
    # The simulated training job's name (two simulated clusters beside each other run
    # two jobs).
    job_name: str = "llm-pretrain"
    members: list[SimNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise SimConfigError(f"--nodes must be between 1 and {MAX_NODES}, got {self.nodes}")
        if not 0 <= self.gpus <= MAX_GPUS:
            raise SimConfigError(f"--gpus must be between 0 and {MAX_GPUS}, got {self.gpus}")
        if self.base_port + self.nodes - 1 > 65535:
            last = self.base_port + self.nodes - 1
            raise SimConfigError(f"ports {self.base_port}..{last} do not fit below 65536: "
                                 "lower --base-port")
        # Reads of simulated nodes are cheap; two threads serve all of them.
        self._executor = ThreadPoolExecutor(2, thread_name_prefix="tuimon-sim")
        width = max(3, len(str(self.nodes - 1)))
        if self.speed != 1.0:
            if not 0 < self.speed <= MAX_SPEED:
                raise SimConfigError(f"--speed must be in (0, {MAX_SPEED:g}], got {self.speed}")
            real_mono, real_wall, speed = self.clock, self.wall, self.speed
            m0, w0 = real_mono(), real_wall()
            self.clock = lambda: m0 + (real_mono() - m0) * speed
            self.wall = lambda: w0 + (real_mono() - m0) * speed
        self.t0, self.wall0 = self.clock(), self.wall()
        self.plan = scenarios.build(
            self.scenario, self.nodes, self.gpus, self.seed, self.nodes_per_leaf,
            lambda i: f"{self.name_prefix}{i:0{width}d}", self.leaf_of)
        troubles = self.plan.troubles
        onset = self.t0 + (self.fault_at if self.scenario != "mixed" else 0.0)
        for trouble in troubles.values():
            trouble.since = onset
        for i in range(self.nodes):
            name = f"{self.name_prefix}{i:0{width}d}"
            model = SimNodeModel(name, self.gpus, seed=self.seed * 100003 + i,
                                 trouble=troubles.get(i) or NodeTrouble(), clock=self.clock,
                                 roce=self.plan.roce)
            self.members.append(SimNode(i, name, self.base_port + i, model,
                                        self._agent(name, model)))
        plans = [RankPlan(m.index, g, m.index * self.gpus + g, _slowdown_of(m, g))
                 for m in self.members for g in range(self.gpus)]
        faulty = lambda: self.clock() >= onset  # noqa: E731
        fabric = FabricState(
            allreduce_factor=lambda: self.plan.allreduce_factor if faulty() else 1.0,
            io_stall_s=lambda: self.plan.io_stall_s if faulty() else 0.0)
        self.job = SimJob(self.job_name, plans, fabric, self.seed)
        self.onset = onset
        self._job_task: asyncio.Task[None] | None = None
        self._restart_task: asyncio.Task[None] | None = None

    def leaf_of(self, index: int) -> str:
        return f"leaf{index // self.nodes_per_leaf:02d}"

    def topology_conf(self) -> str:
        """The simulated fabric as Slurm's topology.conf describes a two-level tree."""
        leaves: dict[str, list[str]] = {}
        for m in self.members:
            leaves.setdefault(self.leaf_of(m.index), []).append(m.name)
        lines = [f"# tuimon simulator: {self.nodes} nodes, {len(leaves)} leaves, "
                 f"{self.spines} spines"]
        leaf_names = ",".join(leaves)
        lines += [f"SwitchName=spine{s} Switches={leaf_names}" for s in range(self.spines)]
        lines += [f"SwitchName={leaf} Nodes={','.join(names)}" for leaf, names in leaves.items()]
        return "\n".join(lines) + "\n"

    @property
    def targets(self) -> list[str]:
        return [m.target for m in self.members]

    def write_targets(self, path: str | Path) -> None:
        Path(path).write_text("".join(f"{t}\n" for t in self.targets))

    def _agent(self, name: str, model: SimNodeModel) -> NodeAgent:
        """A node's agent over its simulated machine (again after a restart: from
        scratch, as a real one starts)."""
        return NodeAgent(
            AgentConfig(node_name=name, interval=self.interval, xid_wait=0.5,
                        storage=StorageConfig(mmpmon=None, statvfs=model.io.statvfs,
                                              statvfs_inline=True)),
            files=GeneratedTree(model.files()),
            nvml_loader=_nvml_of(model),
            executor=self._executor,
            monotonic=self.clock,
            wall=self.wall,
            ethtool=model.io.ethtool(),
        )

    async def start(self) -> None:
        for m in self.members:
            await self.start_node(m.index)
        if self.gpus:
            self._job_task = asyncio.create_task(self._report_steps())
        if self.plan.restart:
            self._restart_task = asyncio.create_task(self._restart_at_onset())

    async def _restart_at_onset(self) -> None:
        """The scenario's nodes whose agents restart at its onset (what a driver upgrade
        does to them shows when their agent starts again)."""
        while self.clock() < self.onset:
            await asyncio.sleep(0.2)
        for index in self.plan.restart:
            await self.stop_node(index)
            await self.start_node(index)

    async def _report_steps(self) -> None:
        last = self.clock()
        while True:
            await asyncio.sleep(self.interval / 2)
            now = self.clock()
            self.report_steps(now - last, only_running=True)
            last = now

    def report_steps(self, seconds: float, only_running: bool = False) -> None:
        """The ranks' step datagrams for `seconds` of training, handed to each node's
        agent as they would arrive on its socket."""
        for index, datagrams in self.job.datagrams(seconds, self.wall()).items():
            member = self.members[index]
            if only_running and member.runner is None:
                continue  # a stopped node's ranks report to no one
            for data in datagrams:
                member.agent.steps.add(data)

    def truth(self) -> dict[str, object]:
        """Ground truth for scoring a diagnosis: scenario, onset, components at fault."""
        onset = self.t0 if self.plan.from_start else self.onset
        return {"scenario": self.scenario, "onset": self.wall0 + (onset - self.t0),
                "fault_at": self.fault_at, "components": list(self.plan.components),
                "kinds": list(self.plan.kinds)}

    async def start_node(self, index: int) -> None:
        m = self.members[index]
        if m.runner is not None:
            return
        runner = web.AppRunner(build_app(m.agent, token=self.token), handle_signals=False,
                               access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, m.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(exc.errno, f"simulated node {m.name}: cannot listen on "
                                     f"{self.host}:{m.port}: {exc.strerror}") from None
        m.runner = runner

    async def stop_node(self, index: int) -> None:
        """Take one node off the network, as if its agent died."""
        m = self.members[index]
        if m.runner is not None:
            await m.runner.cleanup()
            m.runner = None
            self.renew_agent(index)

    def renew_agent(self, index: int) -> NodeAgent:
        """A new agent for a node whose agent stopped: it starts from scratch, as a
        real one would, on the same simulated machine."""
        m = self.members[index]
        m.agent = self._agent(m.name, m.model)
        return m.agent

    async def stop(self) -> None:
        for task in (self._job_task, self._restart_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._job_task = self._restart_task = None
        await asyncio.gather(*(self.stop_node(m.index) for m in self.members))
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def ports_free(host: str, base: int, count: int) -> bool:
    for port in range(base, base + count):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_port_block(host: str, base: int, count: int) -> int:
    """`base` if its `count` ports are free, else the next block of them that is (a
    second demo beside a running one gets ports of its own instead of watching the
    first one's agents under the wrong names)."""
    for start in range(base, 65536 - count, count):
        if ports_free(host, start, count):
            return start
    raise OSError(f"no {count} free ports on {host} from {base}")


async def serve_forever(cluster: SimCluster) -> None:
    async with cluster:
        log.info("simulating %d nodes on %s:%d..%d", cluster.nodes, cluster.host,
                 cluster.base_port, cluster.base_port + cluster.nodes - 1)
        await asyncio.Event().wait()
