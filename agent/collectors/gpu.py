"""GPU collector over NVML (the `pynvml` module that nvidia-ml-py provides).

Every call goes through `_Reader`, which turns NVML's errors into what the wire says:
"not supported" is nil, another error is nil with its reason in `errors`, and an error
that means the GPU itself is gone marks that GPU failed while the others go on.
These calls block (NVML can take tens of milliseconds on a sick GPU), so the sampler
runs them in a worker thread, never on the event loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from agent.collectors.pci import PciPaths
from agent.collectors.processes import ProcessNames, processes
from agent.files import FileTree
from agent.rates import RateTracker
from tuimon_core.link_rules import bus_address
from tuimon_core.protocol.fields import CLOCK_EVENT_REASONS, NVML_PCIE_KB
from tuimon_core.protocol.messages import Event, GpuInfo

log = logging.getLogger(__name__)

MHZ = 1_000_000.0
UINT_MAX = 0xFFFFFFFF  # field-value scope: summed over all NVLink links
FI_NVLINK_DATA_TX = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB
# Error totals over all links (scope ignored), and the PCIe replay counter: read in the
# same NVML call as the data counters, so a GPU's link health costs no extra call.
FI_NVLINK_CRC_FLIT = 38  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
FI_NVLINK_CRC_DATA = 45  # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
FI_NVLINK_REPLAY = 52  # NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
FI_NVLINK_RECOVERY = 59  # NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
FI_PCIE_REPLAY = 94  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
FI_NVLINK_DATA_RX = 139
# The same call reads what would otherwise be three calls of their own: the ECC totals
# (single and double bit aggregate: nvmlDeviceGetTotalEccErrors' corrected and
# uncorrected aggregate counts) and the energy counter (mJ). A field the driver does
# not answer is read by its own call, which says what it always said.
FI_ECC_SBE_AGG = 5  # NVML_FI_DEV_ECC_SBE_AGG_TOTAL
FI_ECC_DBE_AGG = 6  # NVML_FI_DEV_ECC_DBE_AGG_TOTAL
FI_ENERGY = 83  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
# PCIe bytes each way since the driver loaded (NVML_FI_DEV_PCIE_COUNT_TX_BYTES and
# _RX_BYTES, drivers from R555): the rate over the whole interval from the same call,
# where nvmlDeviceGetPcieThroughput measures 20 ms of traffic per call, and is said to
# block that long each way. nvml.h says only that the value "can be wrapped": a counter
# is trusted once it has been seen past 2^32 (wider than 32 bits, which would wrap
# several times a second at Gen5 speeds, unseen), and only as an integer value type.
# Until then, for a first read (no rate yet) and where unanswered: the throughput call.
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198
_PCIE_BYTES = frozenset({FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES})
_WIDE_VALUE_TYPES = frozenset({2, 3, 4})  # NVML_VALUE_TYPE_UNSIGNED_LONG(_LONG), SIGNED_LL
_WIDE = 1 << 32
_FIELD_IDS = (FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX, FI_NVLINK_CRC_FLIT, FI_NVLINK_CRC_DATA,
              FI_NVLINK_REPLAY, FI_NVLINK_RECOVERY, FI_PCIE_REPLAY, FI_ECC_SBE_AGG,
              FI_ECC_DBE_AGG, FI_ENERGY, FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES)
# (field id, scope): NVLink data summed over all links; the rest ignore the scope.
_FIELD_REQUEST = [(fid, UINT_MAX if fid in (FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX) else 0)
                  for fid in _FIELD_IDS]
# The request without the PCIe byte fields, for a driver that refuses the whole call
# for field ids newer than itself.
_OLDER_FIELD_REQUEST = [f for f in _FIELD_REQUEST if f[0] not in _PCIE_BYTES]

# NVML return codes (stable across releases; pynvml names them NVML_ERROR_*).
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
GPU_NOT_FOUND = 28
# Errors after which nothing on this GPU can be trusted.
FATAL_CODES = frozenset({GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND})
QUIET_CODES = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})
# Values that change rarely (power limit, row remapping) are read every SLOW_EVERY samples.
SLOW_EVERY = 10
MEMORY_HEALTH_KEYS = ("remapped_rows", "remap_pending", "remap_failed", "retired_pages",
                      "retired_pending")


def _small(value: Any) -> int | None:
    """A link generation or width as NVML gives it, or None for nonsense."""
    return int(value) if isinstance(value, int) and 0 < value <= 64 else None


class GpuFailed(Exception):
    """Raised inside a GPU's read when NVML says the GPU itself is gone."""


def load_nvml() -> ModuleType:
    """Import the NVML binding (nvidia-ml-py); tests put a fake in sys.modules first."""
    return importlib.import_module("pynvml")


def decode_clock_events(mask: int) -> list[str]:
    """Clock-event reason bitmask to names, unknown bits kept as hex."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def _proc_memory(procs: list[Any]) -> int:
    used = [p.usedGpuMemory for p in procs if isinstance(p.usedGpuMemory, int)]
    return sum(u for u in used if u < 1 << 62)  # NVML_VALUE_NOT_AVAILABLE


def _profile(name: str) -> str | None:
    """`NVIDIA A100-SXM4-80GB MIG 2g.20gb` -> `2g.20gb` (NVML names a MIG device so)."""
    _, sep, tail = name.rpartition(" MIG ")
    return tail.strip() or None if sep else None


def handle_key(handle: Any) -> Any:
    """A comparable key for an NVML handle: ctypes pointers compare by address."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return handle


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


@dataclass(slots=True)
class _Reader:
    """Calls NVML for one GPU and files errors by field."""

    nvml: Any
    errors: dict[str, str] = field(default_factory=dict)
    code: int | None = None  # the NVML error of the last call that failed

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            code = self.code = getattr(exc, "value", None)
            if code in FATAL_CODES:
                raise GpuFailed(_text(exc) or f"NVML error {code}") from None
            if code not in QUIET_CODES:
                self.errors[name] = _text(exc) or f"NVML error {code}"
            return None
        except AttributeError:
            return None  # an older binding without this call: not supported


class GpuCollector:
    """Reads every GPU of the node; one GPU's failure never stops the others."""

    def __init__(self, nvml_loader: Callable[[], Any] = load_nvml,
                 files: FileTree | None = None) -> None:
        self._loader = nvml_loader
        # /proc under the agent's root, to name the processes on each GPU; /sys, for the
        # PCIe links between each GPU and its root port.
        self._names = ProcessNames(files) if files is not None else None
        self._paths = PciPaths(files) if files is not None else None
        self.nvml: Any = None
        self.status: str | None = "NVML not initialised yet"
        self.driver_version: str | None = None
        self.cuda_version: str | None = None
        self.inventory: list[GpuInfo] = []
        # Set when a slow read finds the inventory changed (an NVLink went down): the
        # agent sends a new hello.
        self.inventory_changed = False
        self._handles: list[Any] = []
        self._rates = RateTracker()
        # What the field-values call asks: _OLDER_FIELD_REQUEST where the driver refused
        # the full one before it ever answered it and answered the older one (one driver
        # for the life of the collector; a later error is the GPU's, not a refusal).
        self._field_request = _FIELD_REQUEST
        self._field_answered = False
        self._older_tried = False
        self._pcie_wide: set[int] = set()  # GPUs whose PCIe byte counters passed 2^32
        self._failed: dict[int, str] = {}
        self._last_ecc: dict[int, int] = {}
        self.xid_total: dict[int, int] = {}
        self.last_xid: dict[int, int] = {}
        self._slow: dict[tuple[int, str], Any] = {}
        self._reads: dict[int, int] = {}
        self._reasons_fn: Callable[[Any], int] | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Initialise NVML and read the inventory; without a driver, say why and go on."""
        try:
            nvml = self._loader()
        except Exception as exc:  # import of the binding itself failed
            self.status = f"NVML binding unavailable: {exc}"
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self.status = f"no NVIDIA driver or GPU: NVML init failed ({_text(exc)})"
            return
        except OSError as exc:
            self.status = f"no NVIDIA driver or GPU: {exc}"
            return
        self.nvml = nvml
        self.status = None
        self._reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        try:
            self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            self.driver_version = None
        try:  # 12040 is CUDA 12.4
            cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
            self.cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except (nvml.NVMLError, AttributeError, TypeError, ValueError):
            self.cuda_version = None
        self.refresh_inventory()

    def close(self) -> None:
        if self.nvml is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
            self.nvml = None

    def refresh_inventory(self) -> bool:
        """Re-read the device list; True when it differs from the one we had."""
        nvml = self.nvml
        if nvml is None:
            return False
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self.status = f"NVML cannot count devices: {_text(exc)}"
            changed = bool(self.inventory)
            self.inventory, self._handles = [], []
            return changed
        handles: list[Any] = []  # NVML device handles; None for a GPU without one
        inventory: list[GpuInfo] = []
        for i in range(count):
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
            except nvml.NVMLError as exc:
                # Keep the slot so indexes stay NVML's; the GPU reads as failed.
                handles.append(None)
                inventory.append(GpuInfo(i, None, None, None, None, None, None, None))
                self._failed[i] = f"no handle: {_text(exc)}"
                continue
            handles.append(h)
            inventory.append(self._info(i, h))
        old = [(g.index, g.uuid) for g in self.inventory]
        self.inventory, self._handles = inventory, handles
        if count == 0 and self.status is None:
            self.status = "NVIDIA driver loaded but it reports no GPUs"
        return old != [(g.index, g.uuid) for g in inventory]

    def device_count_changed(self) -> bool:
        """Cheap check run each sample: did GPUs appear or fall off the bus?"""
        nvml = self.nvml
        if nvml is None:
            return False
        try:
            return nvml.nvmlDeviceGetCount() != len(self._handles)
        except nvml.NVMLError:
            return bool(self._handles)

    def _info(self, i: int, h: Any) -> GpuInfo:
        nvml = self.nvml
        r = _Reader(nvml)
        try:
            mem = r("mem_total", nvml.nvmlDeviceGetMemoryInfo, h)
            limit = r("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
            pci = r("pci_bus_id", nvml.nvmlDeviceGetPciInfo, h)
            max_sm = r("max_sm_clock", nvml.nvmlDeviceGetMaxClockInfo, h, 1)
            max_mem = r("max_mem_clock", nvml.nvmlDeviceGetMaxClockInfo, h, 2)
            uuid = r("uuid", nvml.nvmlDeviceGetUUID, h)
            name = r("name", nvml.nvmlDeviceGetName, h)
            vbios = r("vbios", nvml.nvmlDeviceGetVbiosVersion, h)
            gen_max = r("pcie_gen_max", nvml.nvmlDeviceGetMaxPcieLinkGeneration, h)
            width_max = r("pcie_width_max", nvml.nvmlDeviceGetMaxPcieLinkWidth, h)
            nvlinks, nvlinks_total = self._nvlink_state(h)
        except GpuFailed as exc:
            self._failed[i] = str(exc)
            return GpuInfo(i, None, None, None, None, None, None, None)
        return GpuInfo(
            index=i,
            uuid=_text(uuid) if uuid is not None else None,
            name=_text(name) if name is not None else None,
            mem_total=int(mem.total) if mem is not None else None,
            power_limit=limit / 1000.0 if limit is not None else None,
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            max_sm_clock=max_sm * MHZ if max_sm is not None else None,
            max_mem_clock=max_mem * MHZ if max_mem is not None else None,
            vbios=_text(vbios) if vbios is not None else None,
            pcie_gen_max=_small(gen_max), pcie_width_max=_small(width_max),
            nvlinks=nvlinks, nvlinks_total=nvlinks_total,
            pcie_path=self._read_path(_text(pci.busId) if pci is not None else None),
        )

    def _read_path(self, bus_id: str | None) -> list[dict[str, Any]] | None:
        """The GPU's PCIe path from sysfs (what each link's ends support), with the
        inventory: it changes only when the hardware does."""
        address = bus_address(bus_id) if bus_id else None
        if self._paths is None or address is None:
            return None
        return self._paths.read(address)

    def _nvlink_state(self, h: Any) -> tuple[int | None, int | None]:
        """(links active, links the GPU has): NVML answers each link up to
        NVML_NVLINK_MAX_LINKS, and INVALID_ARGUMENT past the GPU's own; a GPU without
        NVLink answers NOT_SUPPORTED (None, None)."""
        nvml = self.nvml
        most = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        active = total = 0
        for link in range(most):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(h, link)
            except nvml.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code in FATAL_CODES:
                    raise GpuFailed(_text(exc) or f"NVML error {code}") from None
                break  # past its links, or none at all
            except AttributeError:
                break  # an older binding
            total += 1
            active += 1 if state == 1 else 0
        return (active, total) if total else (None, None)

    # -- sampling --------------------------------------------------------------------

    def collect(self, now: float, wall: float) -> tuple[list[dict[str, Any]], list[Event]]:
        """Read every GPU once. `now` is monotonic (for rates), `wall` Unix time."""
        gpus: list[dict[str, Any]] = []
        events: list[Event] = []
        for i, h in enumerate(self._handles):
            was_failed = self._failed.get(i)
            if h is None:
                values: dict[str, Any] = {"failed": was_failed or "no NVML handle"}
            else:
                try:
                    values = self._read_gpu(i, h, now)
                    self._failed.pop(i, None)
                except GpuFailed as exc:
                    reason = str(exc)
                    values = {"failed": reason}
                    self._failed[i] = reason
                    self._rates.forget(i)
                    self._reads.pop(i, None)  # read everything again once it is back
            values["xid_total"] = self.xid_total.get(i, 0)
            values["last_xid"] = self.last_xid.get(i)
            failed_now = values.get("failed")
            if failed_now and not was_failed:
                events.append(Event(wall, "gpu_failed", "critical",
                                    f"GPU {i} failed: {failed_now}", gpu=i, source="gpu"))
            elif was_failed and not failed_now:
                events.append(Event(wall, "gpu_recovered", "info",
                                    f"GPU {i} readable again", gpu=i, source="gpu"))
            ecc = values.get("ecc_uncorrected")
            if ecc is not None:
                before = self._last_ecc.get(i)
                if before is not None and ecc > before:
                    events.append(Event(wall, "ecc", "critical",
                                        f"GPU {i}: {ecc - before} new uncorrected ECC "
                                        f"error(s), {ecc} in all", gpu=i, source="gpu"))
                self._last_ecc[i] = ecc
            gpus.append(values)
        if self._names is not None:
            self._names.end_sample()
        return gpus, events

    def _read_gpu(self, i: int, h: Any, now: float) -> dict[str, Any]:
        nvml = self.nvml
        r = _Reader(nvml)
        v: dict[str, Any] = {}

        util = r("util", nvml.nvmlDeviceGetUtilizationRates, h)
        v["util"] = util.gpu / 100.0 if util is not None else None
        v["mem_util"] = util.memory / 100.0 if util is not None else None

        mem = r("mem_used", nvml.nvmlDeviceGetMemoryInfo, h)
        v["mem_used"] = int(mem.used) if mem is not None else None
        v["mem_total"] = int(mem.total) if mem is not None else None

        temp = r("temp", nvml.nvmlDeviceGetTemperature, h, 0)  # NVML_TEMPERATURE_GPU
        v["temp"] = float(temp) if temp is not None else None

        power = r("power", nvml.nvmlDeviceGetPowerUsage, h)  # mW
        v["power"] = power / 1000.0 if power is not None else None
        slow = self._slow_due(i)
        if slow:
            limit = r("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
            self._slow[(i, "power_limit")] = limit / 1000.0 if limit is not None else None
        v["power_limit"] = self._slow.get((i, "power_limit"))
        counters = self._field_counters(r, h)
        energy = counters[FI_ENERGY] if FI_ENERGY in counters else r(
            "energy", nvml.nvmlDeviceGetTotalEnergyConsumption, h)  # mJ
        v["energy"] = energy / 1000.0 if energy is not None else None

        sm = r("sm_clock", nvml.nvmlDeviceGetClockInfo, h, 1)  # NVML_CLOCK_SM, MHz
        v["sm_clock"] = sm * MHZ if sm is not None else None
        memclk = r("mem_clock", nvml.nvmlDeviceGetClockInfo, h, 2)  # NVML_CLOCK_MEM
        v["mem_clock"] = memclk * MHZ if memclk is not None else None

        reasons_fn = self._reasons_fn
        mask = r("clock_events", reasons_fn, h) if reasons_fn else None
        v["clock_events"] = decode_clock_events(int(mask)) if mask is not None else None

        pstate = r("pstate", nvml.nvmlDeviceGetPerformanceState, h)
        v["pstate"] = int(pstate) if pstate is not None and 0 <= pstate <= 15 else None

        # Memory error type 0/1 = corrected/uncorrected; counter type 1 = aggregate.
        corr = counters[FI_ECC_SBE_AGG] if FI_ECC_SBE_AGG in counters else r(
            "ecc_corrected", nvml.nvmlDeviceGetTotalEccErrors, h, 0, 1)
        unc = counters[FI_ECC_DBE_AGG] if FI_ECC_DBE_AGG in counters else r(
            "ecc_uncorrected", nvml.nvmlDeviceGetTotalEccErrors, h, 1, 1)
        v["ecc_corrected"] = int(corr) if corr is not None else None
        v["ecc_uncorrected"] = int(unc) if unc is not None else None

        if slow:
            self._read_memory_health(i, h, r)
        for key in MEMORY_HEALTH_KEYS:
            v[key] = self._slow.get((i, key))

        gen = r("pcie_gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
        width = r("pcie_width", nvml.nvmlDeviceGetCurrPcieLinkWidth, h)
        v["pcie_gen"], v["pcie_width"] = _small(gen), _small(width)
        if slow:
            self._check_links(i, h)
            self._check_path(i)
        path_now = self._path_now(i)
        if path_now is not None:
            v["pcie_path_gen"], v["pcie_path_width"] = path_now

        tx_bytes, rx_bytes = counters.get(FI_PCIE_TX_BYTES), counters.get(FI_PCIE_RX_BYTES)
        # A decrease is a reset (the driver reloaded): no rate this time.
        tx_rate = self._rates.rate((i, "pcie_tx"), tx_bytes, now)
        rx_rate = self._rates.rate((i, "pcie_rx"), rx_bytes, now)
        if tx_bytes is not None and rx_bytes is not None and max(tx_bytes, rx_bytes) >= _WIDE:
            self._pcie_wide.add(i)
        if i in self._pcie_wide and tx_rate is not None and rx_rate is not None:
            v["pcie_tx"], v["pcie_rx"] = tx_rate, rx_rate
        else:
            tx = r("pcie_tx", nvml.nvmlDeviceGetPcieThroughput, h, 0)
            rx = r("pcie_rx", nvml.nvmlDeviceGetPcieThroughput, h, 1)
            v["pcie_tx"] = tx * NVML_PCIE_KB if tx is not None else None
            v["pcie_rx"] = rx * NVML_PCIE_KB if rx is not None else None

        tx_total, rx_total = counters[FI_NVLINK_DATA_TX], counters[FI_NVLINK_DATA_RX]
        v["nvlink_tx_total"] = tx_total
        v["nvlink_rx_total"] = rx_total
        v["pcie_replays"] = counters[FI_PCIE_REPLAY]
        v["nvlink_replay_errors"] = counters[FI_NVLINK_REPLAY]
        v["nvlink_recovery_errors"] = counters[FI_NVLINK_RECOVERY]
        flit, data = counters[FI_NVLINK_CRC_FLIT], counters[FI_NVLINK_CRC_DATA]
        v["nvlink_crc_errors"] = None if flit is None and data is None else \
            (flit or 0) + (data or 0)
        v["nvlink_tx"] = self._rates.rate((i, "nvlink_tx"), tx_total, now)
        v["nvlink_rx"] = self._rates.rate((i, "nvlink_rx"), rx_total, now)

        procs = r("procs", nvml.nvmlDeviceGetComputeRunningProcesses, h)
        if procs is not None:
            v["procs"] = len(procs)
            v["proc_mem"] = _proc_memory(procs)
            if self._names is not None and procs:
                v["processes"] = processes(procs, self._names)
        else:
            v["procs"] = v["proc_mem"] = None

        if slow:
            mode = r("mig_mode", nvml.nvmlDeviceGetMigMode, h)
            self._slow[(i, "mig_mode")] = int(mode[0]) if mode is not None else None
        v["mig_mode"] = self._slow.get((i, "mig_mode"))
        if v["mig_mode"]:
            self._read_mig(h, r, v)

        if r.errors:
            v["errors"] = r.errors
        return v

    def _read_mig(self, h: Any, r: _Reader, v: dict[str, Any]) -> None:
        """A GPU in MIG mode: its instances through their own handles (memory, processes),
        and what NVML will not say of the whole GPU, nil with the reason."""
        nvml = self.nvml
        for key in ("util", "mem_util"):
            if v.get(key) is None:
                r.errors.setdefault(key, "not available in MIG mode (per-instance activity "
                                         "needs DCGM profiling)")
        count = r("mig", nvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0
        instances = []
        for slot in range(int(count)):
            try:
                mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) in FATAL_CODES:
                    raise GpuFailed(_text(exc)) from None
                continue  # an empty slot (NVML_ERROR_NOT_FOUND)
            mr = _Reader(nvml)
            gi = mr("gi", nvml.nvmlDeviceGetGpuInstanceId, mh)
            if gi is None:
                continue
            mem = mr("mem", nvml.nvmlDeviceGetMemoryInfo, mh)
            procs = mr("procs", nvml.nvmlDeviceGetComputeRunningProcesses, mh)
            name = mr("name", nvml.nvmlDeviceGetName, mh)
            uuid = mr("uuid", nvml.nvmlDeviceGetUUID, mh)
            entry: dict[str, Any] = {
                "gi": int(gi), "ci": mr("ci", nvml.nvmlDeviceGetComputeInstanceId, mh),
                "profile": _profile(_text(name)) if name is not None else None,
                "uuid": _text(uuid) if uuid is not None else None,
                "mem_used": int(mem.used) if mem is not None else None,
                "mem_total": int(mem.total) if mem is not None else None,
                "procs": len(procs) if procs is not None else None,
                "proc_mem": _proc_memory(procs) if procs is not None else None,
            }
            if procs and self._names is not None:
                entry["processes"] = processes(procs, self._names)
            if mr.errors:
                entry["errors"] = mr.errors
            instances.append(entry)
        v["mig"] = instances
        if v.get("procs") is None and instances:
            v["procs"] = sum(m["procs"] or 0 for m in instances)

    def _read_memory_health(self, i: int, h: Any, r: _Reader) -> None:
        """Remapped rows (Ampere and later) or retired pages (before): these change
        rarely and cost several calls, so they are read every SLOW_EVERY samples."""
        nvml = self.nvml
        mh: dict[str, Any] = {}
        rows = r("remapped_rows", nvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr_rows, unc_rows, pending, failure = rows
            mh["remapped_rows"] = int(corr_rows) + int(unc_rows)
            mh["remap_pending"] = 1 if pending else 0
            mh["remap_failed"] = 1 if failure else 0
            mh["retired_pages"] = mh["retired_pending"] = None
        else:
            # Pre-Ampere GPUs retire pages instead of remapping rows.
            mh["remapped_rows"] = mh["remap_pending"] = mh["remap_failed"] = None
            single = r("retired_pages", nvml.nvmlDeviceGetRetiredPages, h, 0)
            double = r("retired_pages", nvml.nvmlDeviceGetRetiredPages, h, 1)
            if single is None and double is None:
                mh["retired_pages"] = None
            else:
                mh["retired_pages"] = len(single or ()) + len(double or ())
            pend = r("retired_pending", nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
            mh["retired_pending"] = (1 if pend else 0) if pend is not None else None

        for key, value in mh.items():
            self._slow[(i, key)] = value

    def _slow_due(self, i: int) -> bool:
        n = self._reads.get(i, 0)
        self._reads[i] = n + 1
        return n % SLOW_EVERY == 0

    def _field_counters(self, r: _Reader, h: Any) -> dict[int, int | None]:
        """NVLink data (bytes), NVLink error totals, PCIe replays, ECC totals, energy and
        PCIe bytes in one NVML call. NVLink and PCIe replay fields the GPU does not answer
        are None; an ECC, energy or PCIe byte field the call did not answer, even as "not
        supported" (a driver may answer the call and not the field), a PCIe byte count
        narrower than 64 bits, or a binding without the call, is left out, for the caller
        to read by its own call: never less than the call would say."""
        request = self._field_request
        r.code = None
        values = r("field_values", self.nvml.nvmlDeviceGetFieldValues, h, request)
        if values is not None:
            self._field_answered = True
        elif r.code in (INVALID_ARGUMENT, NOT_SUPPORTED) and not (
                self._field_answered or self._older_tried):
            # Once, before the call ever answered: a driver before the PCIe byte fields
            # may refuse the whole call for them, and the NVLink and ECC counters with it.
            self._older_tried = True
            code, refused = r.code, r.errors.pop("field_values", None)  # None: quiet
            older = r("field_values", self.nvml.nvmlDeviceGetFieldValues, h,
                      _OLDER_FIELD_REQUEST)
            if older is None:
                if refused is not None:
                    r.errors.setdefault("field_values", refused)
            else:
                log.info("NVML refused the field-values call with the PCIe byte fields "
                         "(%s) and answered it without: PCIe throughput by its own call",
                         refused or f"NVML error {code}")
                request = self._field_request = _OLDER_FIELD_REQUEST
                values = older
        out: dict[int, int | None] = dict.fromkeys(_FIELD_IDS[:7])
        for (fid, _), fv in zip(request, values or ()):
            if fv.nvmlReturn == 0 and (fid not in _PCIE_BYTES
                                       or getattr(fv, "valueType", None) in _WIDE_VALUE_TYPES):
                value = int(fv.value.ullVal)
                # The data counters are KiB; the rest are counts (energy: mJ).
                out[fid] = value * 1024 if fid in (FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX) \
                    else value
        return out

    def _check_links(self, i: int, h: Any) -> None:
        """Every SLOW_EVERY samples: the NVLinks that are up. A link that went down (or
        came back) changes the inventory: the hello says so, and fleet comparisons see it."""
        if i >= len(self.inventory):
            return
        info = self.inventory[i]
        active, total = self._nvlink_state(h)
        if (active, total) != (info.nvlinks, info.nvlinks_total):
            self.inventory[i] = dataclasses.replace(info, nvlinks=active, nvlinks_total=total)
            self.inventory_changed = True

    def _check_path(self, i: int) -> None:
        """Every SLOW_EVERY samples: the GPU's PCIe path again (one that could not be read
        at start, a device re-enumerated); a change is a new hello."""
        if i >= len(self.inventory) or self._paths is None:
            return
        info = self.inventory[i]
        path = self._read_path(info.pci_bus_id)
        if path != info.pcie_path:
            self.inventory[i] = dataclasses.replace(info, pcie_path=path)
            self.inventory_changed = True

    def _path_now(self, i: int) -> tuple[list[int | None], list[int | None]] | None:
        """Each link of the GPU's path now (None: no path read), read every sample as its
        own link is: the rules judge them while the GPU is busy, and a busy GPU is judged
        each second."""
        info = self.inventory[i] if i < len(self.inventory) else None
        address = bus_address(info.pci_bus_id or "") if info is not None else None
        return self._paths.now(address) if self._paths is not None and address else None

    # -- events ------------------------------------------------------------------------

    def note_xid(self, index: int, code: int) -> None:
        self.xid_total[index] = self.xid_total.get(index, 0) + 1
        self.last_xid[index] = code
        # Any XID may come with remapped rows or a changed power state: re-read the
        # slow fields at the next sample instead of up to SLOW_EVERY samples later.
        self._reads.pop(index, None)

    def handle_index(self, handle: Any) -> int | None:
        """Map an NVML handle from an event back to the GPU index."""
        key = handle_key(handle)
        for i, h in enumerate(self._handles):
            if h is not None and handle_key(h) == key:
                return i
        return None

    @property
    def handles(self) -> list[Any]:
        return list(self._handles)
