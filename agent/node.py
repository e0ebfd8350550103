"""The node agent: collectors, the sample loop, and the latest state.

`NodeAgent` is headless and knows nothing of HTTP; `agent.server` serves it. The real
agent, the simulator's nodes and the tests all run this same class; only the NVML
binding and the file tree under it differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agent.collectors.fabric import FabricCollector, StatsReader
from agent.collectors.gpu import GpuCollector, load_nvml
from agent.collectors.gpu_events import XidWatcher
from agent.collectors.host import HostCollector
from agent.collectors.platform import PlatformReader
from agent.collectors.storage import StorageCollector, StorageConfig
from agent.files import FileTree
from agent.findings import NodeFindings
from agent.frame_fit import fit_event, fit_frame, fit_hello, fit_hello_frame, fit_values
from agent.hub import FrameHub
from agent.inventory_change import inventory_change
from agent.steps import StepAggregator, StepSocket, StepSocketError
from tuimon_core.findings_family import findings_to_wire
from tuimon_core.overview import build_overview, hello_port_ids
from tuimon_core.ports import DEFAULT_PORT  # noqa: F401  (re-exported for callers)
from tuimon_core.protocol.fields import FAMILIES, FAMILY_TYPES
from tuimon_core.protocol.messages import Event, GpuInfo, Hello, Sample
from tuimon_core.protocol.text import clean
from tuimon_core.version import __version__

log = logging.getLogger(__name__)
_STEPS = FAMILY_TYPES["steps"]
# The platform (kernel, GPUs on the PCI bus, GPUDirect module) is read this many samples
# apart: it changes with a reboot or an admin's hand, and a read lists the PCI bus. On
# the same cadence, kept file descriptors are checked against their paths (a file
# replaced or removed under a descriptor the agent keeps open).
PLATFORM_EVERY = 60



@dataclass(slots=True)
class AgentConfig:
    """What an agent is told at start; every field has a CLI flag."""

    node_name: str = ""
    interval: float = 1.0
    root: str = "/"
    max_clients: int = 256
    queue_frames: int = 32
    watch_xid: bool = True
    xid_wait: float = 2.0  # seconds one NVML event wait blocks (bounds stop() time)
    storage: StorageConfig | None = None
    # Unix datagram socket training ranks report steps to (agent.reporter); None: off.
    steps_socket: str | None = None

    def __post_init__(self) -> None:
        if not self.node_name:
            self.node_name = socket.gethostname()
        self.node_name = clean(self.node_name)
        if not 0.01 <= self.interval <= 3600:
            raise ValueError(f"interval must be between 0.01 and 3600 s, got {self.interval}")


@dataclass(slots=True)
class AgentStats:
    samples: int = 0
    overruns: int = 0
    last_sample_cpu: float = 0.0
    last_sample_seconds: float = 0.0


class NodeAgent:
    """Samples the node on a steady cadence and publishes frames to its hub."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        files: FileTree | None = None,
        nvml_loader: Callable[[], Any] = load_nvml,
        executor: Executor | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        ethtool: StatsReader | None = None,
    ) -> None:
        self.config = config
        # Clocks are injectable so a seeded simulation can be replayed exactly (snapshots).
        self._monotonic = monotonic
        self._wall = wall
        self.files = files or FileTree(config.root)
        self.gpu = GpuCollector(nvml_loader, self.files)
        self.host = HostCollector(self.files)
        self.fabric = FabricCollector(self.files, ethtool=ethtool)
        self.storage = StorageCollector(self.files, config.storage)
        self.steps = StepAggregator(interval=config.interval, clock=monotonic,
                                    wall_clock=wall)
        self.findings = NodeFindings(config.node_name, monotonic)
        self.platform = PlatformReader(self.files)
        self._platform: dict[str, Any] = {}
        self._steps_socket: StepSocket | None = None
        self.steps_status: str | None = "off"
        self.hub = FrameHub(config.max_clients, config.queue_frames)
        self.stats = AgentStats()
        self.latest: Sample | None = None
        self.hello: Hello | None = None
        self.events_total: dict[str, int] = {}
        self._own_executor = executor is None
        # One worker: NVML and file reads are serialised, never on the event loop.
        self._executor = executor or ThreadPoolExecutor(1, thread_name_prefix="tuimon-read")
        self._task: asyncio.Task[None] | None = None
        self._xid: XidWatcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._family_failure: dict[str, str | None] = {}
        self._seq = 0
        self.started_at = time.time()

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, *, sampling: bool = True) -> None:
        """Open NVML, read the inventory, and (unless told not to) start sampling."""
        self._loop = asyncio.get_running_loop()
        await self._loop.run_in_executor(self._executor, self.gpu.start)
        boot_id = await self._loop.run_in_executor(self._executor, self.host.boot_id)
        self._boot_id = boot_id
        # A first read of fabric and storage so that `hello` lists their inventory.
        await self._loop.run_in_executor(self._executor, self._first_inventory)
        if self.config.steps_socket:
            try:
                sock = StepSocket(self.config.steps_socket, self.steps)
                sock.open()
                self._steps_socket = sock
                self.steps_status = None
            except OSError as exc:
                self.steps_status = (str(exc) if isinstance(exc, StepSocketError) else
                                     f"cannot listen for step reports on "
                                     f"{self.config.steps_socket}: {exc.strerror or exc}")
                log.warning("%s: %s", self.config.node_name, self.steps_status)
        self.hello = self._make_hello()
        if self.gpu.status:
            log.info("%s: %s", self.config.node_name, self.gpu.status)
        if self.config.watch_xid and self.gpu.nvml is not None:
            self._xid = XidWatcher(self.gpu, self.emit_event_threadsafe, self.config.xid_wait)
            if not self._xid.start():
                log.info("%s: XID events off: %s", self.config.node_name, self._xid.status)
        if sampling:
            self._task = asyncio.create_task(self._sample_loop(), name="tuimon-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        loop = asyncio.get_running_loop()
        if self._steps_socket is not None:
            self._steps_socket.close()  # removes the path only if it is still its own
            self._steps_socket = None
        if self._xid is not None:
            # Not in the read worker: joining the XID thread can take one wait timeout,
            # and many agents in one process (the simulator) stop side by side.
            await asyncio.to_thread(self._xid.stop)
        await loop.run_in_executor(self._executor, self.gpu.close)
        self.storage.close()
        self.fabric.close()
        self.files.close()
        if self._own_executor:
            self._executor.shutdown(wait=False)

    # -- frames ----------------------------------------------------------------------


    def wall_of(self, t: float) -> float:
        """Unix time of a moment on the agent's monotonic clock (its findings' onsets)."""
        return t + self._wall() - self._monotonic()
    def _make_hello(self) -> Hello:
        # NVML, sysfs and /proc are outside input too: every name and reason leaves the
        # agent fitted to the wire's schema (cleaned and cut), on the wire, in /metrics
        # and in its log.
        hello = fit_hello(Hello(
            node=self.config.node_name,
            agent_version=__version__,
            boot_id=clean(self._boot_id)[:64] if self._boot_id else None,
            interval=self.config.interval,
            ts=self._wall(),
            gpus=[GpuInfo(**g.to_wire()) for g in self.gpu.inventory],
            driver_version=self.gpu.driver_version,
            gpu_status=self.gpu.status,
            families=list(FAMILIES),
            host={"hostname": socket.gethostname() if self.config.root == "/" else None,
                  "kernel": self._platform.get("kernel")},
            extra={**self.fabric.inventory(), **self.storage.inventory(),
                   "fabric_status": self.fabric.status, "steps_status": self.steps_status,
                   "cuda_driver_version": self.gpu.cuda_version,
                   "pci_gpus": self._platform.get("pci_gpus") or [],
                   "gpudirect": self._platform.get("gpudirect")},
        ))
        fit_hello_frame(hello)
        return hello

    def _first_inventory(self) -> None:
        now = self._monotonic()
        self.fabric.collect(now)
        self.storage.collect(now)
        self._platform = self.platform.read()

    def emit_event_threadsafe(self, event: Event) -> None:
        """For the XID thread: hand an event to the loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.emit_event, event)

    def emit_event(self, event: Event) -> None:
        event = fit_event(event)  # a collector's error text may be any length
        self.events_total[event.kind] = self.events_total.get(event.kind, 0) + 1
        level = logging.WARNING if event.severity != "info" else logging.INFO
        log.log(level, "%s: %s", self.config.node_name, event.message)
        self.hub.publish(event)

    # -- sampling --------------------------------------------------------------------

    def _collect(self) -> tuple[Sample, list[Event], bool]:
        """One read of every collector; runs in the worker thread."""
        cpu0 = time.thread_time()
        t0 = time.monotonic()
        now = self._monotonic()
        wall = self._wall()
        events: list[Event] = []
        inventory_changed = False
        if self.gpu.device_count_changed():
            inventory_changed = self.gpu.refresh_inventory()
        if self._seq % PLATFORM_EVERY == PLATFORM_EVERY - 1:
            self.files.revalidate()
            platform = self.platform.read()
            inventory_changed = inventory_changed or platform != self._platform
            self._platform = platform
        gpus: list[dict[str, Any]] | None
        try:
            gpus, gpu_events = self.gpu.collect(now, wall)
            events.extend(gpu_events)
            self._family_ok("gpu", wall, events)
        except Exception as exc:  # a bug or a binding surprise must not stop sampling
            log.exception("GPU collector failed")
            gpus = None
            self._family_failed("gpu", f"GPU collector error: {exc}", wall, events)
        try:
            host = self.host.collect(now)
            if self.host.reads and self.host.failed_reads == self.host.reads:
                self._family_failed("host", "; ".join(sorted(set(host["errors"].values()))),
                                    wall, events)
            else:
                self._family_ok("host", wall, events)
        except Exception as exc:
            log.exception("host collector failed")
            host = None
            self._family_failed("host", f"host collector error: {exc}", wall, events)
        extra: dict[str, Any] = {}
        for family, collector in (("fabric", self.fabric), ("storage", self.storage)):
            try:
                values, changed = collector.collect(now)
                extra[family] = values
                inventory_changed = inventory_changed or changed
                self._family_ok(family, wall, events)
            except Exception as exc:
                log.exception("%s collector failed", family)
                self._family_failed(family, f"{family} collector error: {exc}", wall, events)
        if self.gpu.inventory_changed:  # an NVLink went down or came back
            self.gpu.inventory_changed = False
            inventory_changed = True
        # NVML, sysfs and /proc are outside input too: every value leaves the agent
        # fitted to the wire's schema (names cleaned and cut, lists capped).
        gpus, host = fit_values(gpus, host, extra)
        self._seq += 1
        sample = Sample(seq=self._seq, ts=wall, interval=self.config.interval,
                        gpus=gpus if self.gpu.nvml is not None else [], host=host,
                        extra=extra)
        self.stats.last_sample_cpu = time.thread_time() - cpu0
        self.stats.last_sample_seconds = time.monotonic() - t0
        return sample, events, inventory_changed

    def _family_failed(self, family: str, reason: str, wall: float,
                       events: list[Event]) -> None:
        if self._family_failure.get(family) != reason:
            events.append(Event(wall, "collector_failed", "warning",
                                f"{family} collector failed: {reason}", source=family))
        self._family_failure[family] = reason

    def _family_ok(self, family: str, wall: float, events: list[Event]) -> None:
        if self._family_failure.get(family):
            events.append(Event(wall, "collector_recovered", "info",
                                f"{family} collector recovered", source=family))
        self._family_failure[family] = None

    async def sample_once(self, *, unwatched: bool = False) -> Sample:
        """Collect and publish one sample (the loop's body; also used by `once`). With
        `unwatched` (the loop), a sample no stream client takes is judged, fitted and
        kept for /metrics, without the overview only a stream reads."""
        loop = asyncio.get_running_loop()
        sample, events, inventory_changed = await loop.run_in_executor(
            self._executor, self._collect)
        if inventory_changed:
            before, self.hello = self.hello, self._make_hello()
            self.emit_event(Event(sample.ts, "inventory_changed", "warning",
                                  "inventory changed: "
                                  f"{inventory_change(before, self.hello)}", source="agent"))
            self.hub.publish(self.hello)
        for event in events:
            self.emit_event(event)
        steps = self.steps.take()  # on the loop: datagrams arrive here too
        if steps is not None:
            sample.extra["steps"] = _STEPS.fit(steps)
        # The node judges itself and summarises itself before anyone sees the sample:
        # viewers of the whole cluster take only these two families (tuimon_core.overview).
        conditions = self.findings.observe(self.hello, sample)
        sample.extra["findings"] = findings_to_wire(conditions)
        # An agent only Prometheus scrapes has no reader of the overview, nor one whose
        # clients all asked for a slower cadence and skip this sample; a client that
        # connects gets it from the next sample it takes. The frame is fitted either way:
        # a frame over the size limit has its longest lists cut, and /metrics must show
        # the same lists whether a viewer is connected or not.
        watched = not unwatched or self.hub.takes(sample.seq)
        if watched:
            sample.extra["overview"] = build_overview(self.hello, sample)
        data = fit_frame(sample)
        self.latest = sample
        self.stats.samples += 1
        if watched:
            self.hub.publish_sample(sample, hello_port_ids(self.hello), data)
        return sample

    async def _sample_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.interval
        deadline = loop.time()
        while True:
            try:
                await self.sample_once(unwatched=True)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: sample failed", self.config.node_name)
            # Monotonic deadlines: the cadence does not drift with the time a read takes.
            deadline += interval
            delay = deadline - loop.time()
            if delay < 0:
                missed = int(-delay // interval) + 1
                self.stats.overruns += missed
                deadline += missed * interval
                delay = deadline - loop.time()
            await asyncio.sleep(delay)

    def family_failures(self) -> dict[str, str]:
        return {k: v for k, v in self._family_failure.items() if v}
