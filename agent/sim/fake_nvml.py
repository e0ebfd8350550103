"""A stand-in for the `pynvml` module: the hardware boundary, and nothing above it.

It answers the NVML calls the GPU collector makes, in NVML's own units (mW, MHz, mJ,
KB/s, KiB counters) and with NVML's error codes, so the collector's conversions and
error handling are what gets exercised. Tests program it (unsupported calls, a GPU
lost mid-run, an XID event); the simulator drives its values from a workload model.
"""

from __future__ import annotations

import queue
import sys
import types
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15

_MESSAGES = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    15: "GPU is lost",
}


class NVMLError(Exception):
    """Shaped like pynvml's: `.value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"Unknown Error {self.value}")


@dataclass
class _Memory:
    total: int
    used: int
    free: int


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Pci:
    busId: str


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int


@dataclass
class _FieldValue:
    fieldId: int
    nvmlReturn: int
    value: Any
    valueType: int = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG


@dataclass
class _EventData:
    device: Any
    eventType: int
    eventData: int


@dataclass
class FakeMig:
    """One MIG instance (a GPU instance with its compute instance), as NVML reports it
    through a MIG device handle."""

    gi: int
    profile: str = "1g.20gb"
    ci: int = 0
    mem_total: int = 19968 * 1024**2
    mem_used: int = 12 * 1024**2
    procs: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class FakeGpu:
    """One GPU's state in NVML units. Tests set fields; the simulator updates them."""

    index: int
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    mem_total: int = 80 * 1024**3
    mem_used: int = 0
    util_gpu: int = 0  # percent
    util_mem: int = 0
    temp: int = 35  # °C
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    energy_mj: int = 0
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    max_sm_mhz: int = 1980
    max_mem_mhz: int = 2619
    clock_events: int = 0x1  # gpu_idle
    pstate: int = 0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    retired_pages: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))
    pcie_tx_kbs: int = 0
    pcie_rx_kbs: int = 0
    # Bytes since the driver loaded (NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES, answered by
    # drivers from R555), and the value type they are answered with (3: unsigned long
    # long).
    pcie_tx_bytes: int = 0
    pcie_rx_bytes: int = 0
    pcie_count_type: int = 3
    nvlink_tx_kib: int | None = 0
    nvlink_rx_kib: int | None = 0
    vbios: str = "96.00.74.00.01"
    # PCIe link: current (an idle GPU may drop to a lower generation), and the most the
    # GPU and its slot support together; replays since the driver loaded.
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_gen_max: int = 5
    pcie_width_max: int = 16
    pcie_replays: int = 0
    # NVLink: one state per link (1 active, 0 inactive); None: the GPU has no NVLink
    # (NVML answers NOT_SUPPORTED). Error counters summed over links.
    nvlinks: list[int] | None = field(default_factory=lambda: [1] * 18)
    nvlink_replay: int = 0
    nvlink_recovery: int = 0
    nvlink_crc_flit: int = 0
    nvlink_crc_data: int = 0
    procs: list[tuple[int, int]] = field(default_factory=list)
    # NVML function names that answer NOT_SUPPORTED on this GPU.
    unsupported: set[str] = field(default_factory=set)
    # Function name -> error code, for errors other than "not supported".
    errors: dict[str, int] = field(default_factory=dict)
    lost: bool = False
    # None: not MIG-capable (NVML says not supported); a list: MIG on with these
    # instances (empty: capable, MIG off).
    mig: list[FakeMig] | None = None

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-{self.index:08x}-fake-0000-0000-{self.index:012x}"


# The field values that have a call of their own (agent.collectors.gpu reads them in one).
_FIELD_CALLS = {5: "nvmlDeviceGetTotalEccErrors", 6: "nvmlDeviceGetTotalEccErrors",
                83: "nvmlDeviceGetTotalEnergyConsumption",
                197: "nvmlDeviceGetPcieThroughput", 198: "nvmlDeviceGetPcieThroughput"}


class FakeNvml(types.ModuleType):
    """A module object with pynvml's names; put it in sys.modules['pynvml'] to use."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_NVLINK_MAX_LINKS = 36

    def __init__(self, gpus: list[FakeGpu] | int = 8, *, driver: bool = True,
                 driver_version: str = "550.90.07", cuda_version: int = 12040) -> None:
        super().__init__("pynvml")
        if isinstance(gpus, int):
            gpus = [FakeGpu(i) for i in range(gpus)]
        self.gpus: list[FakeGpu] = gpus
        self.driver = driver
        self.driver_version = driver_version
        self.cuda_version = cuda_version  # as NVML returns it: 12040 is CUDA 12.4
        self.initialised = False
        self.calls = 0
        self._events: queue.Queue[_EventData] = queue.Queue()
        self._registered: dict[int, int] = {}

    # -- helpers for tests and the simulator --------------------------------------

    def install(self) -> FakeNvml:
        sys.modules["pynvml"] = self
        return self

    def inject_xid(self, index: int, code: int) -> None:
        if self._registered.get(index, 0) & 0x8:
            self._events.put(_EventData(index, 0x8, code))

    def refresh(self, gpu: FakeGpu) -> None:
        """Hook the simulator overrides to move a GPU's values on before a read."""

    def _mig(self, handle: Any, fn: str) -> FakeMig:
        self.calls += 1
        _, index, slot = handle
        gpu = self.gpus[index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return (gpu.mig or [])[slot]

    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        self.calls += 1
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if not isinstance(handle, int) or not 0 <= handle < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if fn in gpu.errors:
            raise NVMLError(gpu.errors[fn])
        self.refresh(gpu)
        return gpu

    # -- system -----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if not self.driver:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return index

    # -- device -----------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        if isinstance(h, tuple):
            m = self._mig(h, "nvmlDeviceGetUUID")
            return f"MIG-{h[1]:08x}-{m.gi:04x}-fake-{m.ci:04x}"
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h: Any) -> str:
        if isinstance(h, tuple):
            return f"{self.gpus[h[1]].name} MIG {self._mig(h, 'nvmlDeviceGetName').profile}"
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, h: int) -> _Pci:
        g = self._gpu(h, "nvmlDeviceGetPciInfo")
        return _Pci(f"00000000:{0x18 + 0x10 * g.index:02X}:00.0")

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> _Memory:
        if isinstance(h, tuple):
            m = self._mig(h, "nvmlDeviceGetMemoryInfo")
            return _Memory(m.mem_total, m.mem_used, m.mem_total - m.mem_used)
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return _Memory(g.mem_total, g.mem_used, g.mem_total - g.mem_used)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetMaxClockInfo(self, h: int, kind: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetMaxClockInfo")
        return g.max_sm_mhz if kind == 1 else g.max_mem_mhz

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        return g.sm_mhz if kind == 1 else g.mem_mhz

    def nvmlDeviceGetUtilizationRates(self, h: int) -> _Util:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        if g.mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # as NVML answers in MIG mode
        return _Util(g.util_gpu, g.util_mem)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").clock_events

    def nvmlDeviceGetPerformanceState(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetPerformanceState").pstate

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetTotalEccErrors")
        return g.ecc_corrected if kind == 0 else g.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        g = self._gpu(h, "nvmlDeviceGetRemappedRows")
        if g.remapped is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g.remapped

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        return list(self._gpu(h, "nvmlDeviceGetRetiredPages").retired_pages[cause])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetRetiredPagesPendingStatus")
        return 0

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetPcieThroughput")
        return g.pcie_tx_kbs if counter == 0 else g.pcie_rx_kbs

    def _driver_major(self) -> int:
        major = self.driver_version.split(".", 1)[0]
        return int(major) if major.isdigit() else 0

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[Any]) -> list[_FieldValue]:
        g = self._gpu(h, "nvmlDeviceGetFieldValues")
        nvlink = g.nvlinks is not None
        values = {138: g.nvlink_tx_kib, 139: g.nvlink_rx_kib,
                  38: g.nvlink_crc_flit if nvlink else None,
                  45: g.nvlink_crc_data if nvlink else None,
                  52: g.nvlink_replay if nvlink else None,
                  59: g.nvlink_recovery if nvlink else None, 94: g.pcie_replays,
                  5: g.ecc_corrected, 6: g.ecc_uncorrected, 83: g.energy_mj}
        if self._driver_major() >= 555:  # the PCIe byte fields came with R555
            values.update({197: g.pcie_tx_bytes, 198: g.pcie_rx_bytes})
        out = []
        for fid in ids:
            fid = fid[0] if isinstance(fid, tuple) else fid
            v = values.get(fid)
            ret = NVML_SUCCESS if v is not None else NVML_ERROR_NOT_SUPPORTED
            # A field answers as the call of its own would (a GPU set to fail one).
            own = _FIELD_CALLS.get(fid)
            if own in g.unsupported or f"field:{fid}" in g.unsupported:
                ret = NVML_ERROR_NOT_SUPPORTED  # `field:N`: a driver without the field
            elif own in g.errors:
                ret = g.errors[own]
            out.append(_FieldValue(fid, ret, types.SimpleNamespace(ullVal=v or 0),
                                   g.pcie_count_type if fid in (197, 198) else 3))
        return out

    def nvmlDeviceGetVbiosVersion(self, h: int) -> str:
        return self._gpu(h, "nvmlDeviceGetVbiosVersion").vbios

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen_max

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width_max

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def nvmlDeviceGetNvLinkState(self, device: int, link: int) -> int:
        g = self._gpu(device, "nvmlDeviceGetNvLinkState")
        if g.nvlinks is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(g.nvlinks):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # past the GPU's links
        return g.nvlinks[link]

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[_Proc]:
        if isinstance(h, tuple):
            m = self._mig(h, "nvmlDeviceGetComputeRunningProcesses")
            return [_Proc(pid, mem) for pid, mem in m.procs]
        g = self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [_Proc(pid, mem) for pid, mem in g.procs]

    # -- MIG ----------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        g = self._gpu(h, "nvmlDeviceGetMigMode")
        if g.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = 1 if g.mig else 0
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, index: int) -> tuple[str, int, int]:
        g = self._gpu(h, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not g.mig or index >= len(g.mig):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return ("mig", g.index, index)

    def nvmlDeviceGetGpuInstanceId(self, h: tuple[str, int, int]) -> int:
        return self._mig(h, "nvmlDeviceGetGpuInstanceId").gi

    def nvmlDeviceGetComputeInstanceId(self, h: tuple[str, int, int]) -> int:
        return self._mig(h, "nvmlDeviceGetComputeInstanceId").ci

    # -- events -----------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, event_set: Any) -> None:
        g = self._gpu(h, "nvmlDeviceRegisterEvents")
        self._registered[g.index] = self._registered.get(g.index, 0) | mask

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> _EventData:
        try:
            return self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: Any) -> None:
        pass
