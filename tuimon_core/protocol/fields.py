"""The per-GPU and per-host value fields of protocol v1, with kinds and units.

One table drives validation in the decoder, the Prometheus names in `/metrics`
and the field lists in docs/protocol.md (a test checks the document against it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Field:
    """One value in a sample: its wire key, value kind, SI unit and meaning."""

    key: str
    kind: str  # "num" | "int" | "str" | "strlist" | "dict"
    unit: str
    doc: str


GPU_FIELDS: tuple[Field, ...] = (
    Field("util", "num", "ratio 0..1", "GPU (SM) utilization over the driver's sample period"),
    Field("mem_util", "num", "ratio 0..1", "memory controller utilization"),
    Field("mem_used", "int", "bytes", "device memory in use"),
    Field("mem_total", "int", "bytes", "device memory total"),
    Field("temp", "num", "°C", "GPU core temperature"),
    Field("power", "num", "W", "power draw"),
    Field("power_limit", "num", "W", "enforced power limit"),
    Field("energy", "num", "J", "energy counter since driver load (monotonic)"),
    Field("sm_clock", "num", "Hz", "current SM clock"),
    Field("mem_clock", "num", "Hz", "current memory clock"),
    Field("clock_events", "strlist", "names", "active clock-event (throttle) reasons"),
    Field("pstate", "int", "0..15", "performance state (P0 fastest)"),
    Field("ecc_corrected", "int", "count", "corrected ECC errors, aggregate (lifetime)"),
    Field("ecc_uncorrected", "int", "count", "uncorrected ECC errors, aggregate (lifetime)"),
    Field("retired_pages", "int", "count", "retired pages (pre-Ampere page retirement)"),
    Field("retired_pending", "int", "0/1", "a page retirement awaits a reboot"),
    Field("remapped_rows", "int", "count", "remapped rows, corrected and uncorrected"),
    Field("remap_pending", "int", "0/1", "a row remap awaits a GPU reset"),
    Field("remap_failed", "int", "0/1", "a row remap failed"),
    Field("pcie_tx", "num", "bytes/s", "PCIe transmit throughput"),
    Field("pcie_rx", "num", "bytes/s", "PCIe receive throughput"),
    Field("nvlink_tx", "num", "bytes/s", "NVLink transmit data rate, from the data counter"),
    Field("nvlink_rx", "num", "bytes/s", "NVLink receive data rate, from the data counter"),
    Field("nvlink_tx_total", "int", "bytes", "NVLink transmit data counter"),
    Field("nvlink_rx_total", "int", "bytes", "NVLink receive data counter"),
    Field("procs", "int", "count", "compute processes on the GPU"),
    Field("proc_mem", "int", "bytes", "device memory used by those processes"),
    Field("xid_total", "int", "count", "XID errors seen by this agent since it started"),
    Field("last_xid", "int", "code", "the most recent XID code seen, nil when none"),
    Field("failed", "str", "reason", "set when the GPU could not be read at all (e.g. GPU lost)"),
    Field("errors", "dict", "field -> reason", "fields that failed to read for a reason other "
          "than 'not supported'"),
)

HOST_FIELDS: tuple[Field, ...] = (
    Field("cpu_util", "num", "ratio 0..1", "CPU busy time over the last interval, all cores"),
    Field("cpus", "int", "count", "online logical CPUs"),
    Field("load1", "num", "runnable tasks", "1-minute load average"),
    Field("load5", "num", "runnable tasks", "5-minute load average"),
    Field("load15", "num", "runnable tasks", "15-minute load average"),
    Field("mem_total", "int", "bytes", "physical memory"),
    Field("mem_available", "int", "bytes", "memory available without swapping (MemAvailable)"),
    Field("mem_used", "int", "bytes", "mem_total - mem_available"),
    Field("uptime", "num", "s", "time since boot"),
    Field("errors", "dict", "field -> reason", "host fields that could not be read, and why"),
)

GPU_INFO_FIELDS: tuple[Field, ...] = (
    Field("index", "int", "", "NVML device index"),
    Field("uuid", "str", "", "GPU UUID"),
    Field("name", "str", "", "product name"),
    Field("mem_total", "int", "bytes", "device memory"),
    Field("power_limit", "num", "W", "power management limit"),
    Field("pci_bus_id", "str", "", "PCI bus id"),
    Field("max_sm_clock", "num", "Hz", "maximum SM clock"),
    Field("max_mem_clock", "num", "Hz", "maximum memory clock"),
)

# Clock-event reason bits as NVML defines them (nvmlClocksEventReason*), with the
# names the wire carries. Bits this table lacks are reported as "unknown_0x...".
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

# Reasons that mean the GPU runs slower than it could for a reason worth a look.
THROTTLE_REASONS = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
     "hw_power_brake_slowdown"}
)

FAMILIES: tuple[str, ...] = ("gpu", "host", "fabric", "storage", "steps", "events")
