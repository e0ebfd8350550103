"""The per-GPU and per-host value fields of protocol v1, with kinds and units.

One table drives validation in the decoder, the Prometheus names in `/metrics`
and the field lists in docs/protocol.md (a test checks the document against it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Dcgm:
    """A dcgm-exporter metric that carries the same value: its name, and the factor from
    its unit to the wire's."""

    name: str
    scale: float = 1.0
    # Several metrics that together make the value (corrected + uncorrected rows).
    add: bool = False


@dataclass(frozen=True, slots=True)
class Field:
    """One value in a sample: its wire key, value kind, SI unit and meaning, and the names
    it goes by elsewhere: the agent's `/metrics` name (without `_total` for counters; the
    client library appends it) and dcgm-exporter's, first match wins."""

    key: str
    kind: str  # "num" | "int" | "str" | "strlist" | "dict" | "maplist"
    unit: str
    doc: str
    metric: str | None = None
    counter: bool = False
    dcgm: tuple[Dcgm, ...] = ()
    node_exporter: str | None = None

    @property
    def exposed(self) -> str | None:
        """The name as Prometheus stores it (counters with `_total`)."""
        if self.metric is None:
            return None
        return self.metric + "_total" if self.counter else self.metric


MIB = float(1 << 20)
MHZ = 1e6

GPU_FIELDS: tuple[Field, ...] = (
    Field("util", "num", "ratio 0..1", "GPU utilization over the driver's sample period "
          "(NVML: the share of time a kernel ran, on any SM)",
          "tuimon_gpu_utilization_ratio", dcgm=(Dcgm("DCGM_FI_DEV_GPU_UTIL", 0.01),)),
    Field("mem_util", "num", "ratio 0..1", "memory controller utilization",
          "tuimon_gpu_memory_utilization_ratio",
          dcgm=(Dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", 0.01),)),
    Field("gr_active", "num", "ratio 0..1", "graphics/compute engine active (DCGM "
          "profiling); in MIG mode, per instance", "tuimon_gpu_engine_active_ratio",
          dcgm=(Dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE"),)),
    Field("sm_active", "num", "ratio 0..1", "SMs with at least one warp resident, averaged "
          "over all SMs (DCGM profiling): a truer busy measure than `util`",
          "tuimon_gpu_sm_active_ratio", dcgm=(Dcgm("DCGM_FI_PROF_SM_ACTIVE"),)),
    Field("tensor_active", "num", "ratio 0..1", "tensor pipe active (DCGM profiling)",
          "tuimon_gpu_tensor_active_ratio", dcgm=(Dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),)),
    Field("dram_active", "num", "ratio 0..1", "device memory interface active (DCGM "
          "profiling)", "tuimon_gpu_dram_active_ratio",
          dcgm=(Dcgm("DCGM_FI_PROF_DRAM_ACTIVE"),)),
    Field("mem_used", "int", "bytes", "device memory in use", "tuimon_gpu_memory_used_bytes",
          dcgm=(Dcgm("DCGM_FI_DEV_FB_USED", MIB),)),
    Field("mem_total", "int", "bytes", "device memory total", "tuimon_gpu_memory_total_bytes",
          dcgm=(Dcgm("DCGM_FI_DEV_FB_TOTAL", MIB),)),
    Field("mem_reserved", "int", "bytes", "device memory the driver reserves",
          "tuimon_gpu_memory_reserved_bytes", dcgm=(Dcgm("DCGM_FI_DEV_FB_RESERVED", MIB),)),
    Field("temp", "num", "°C", "GPU core temperature", "tuimon_gpu_temperature_celsius",
          dcgm=(Dcgm("DCGM_FI_DEV_GPU_TEMP"),)),
    Field("power", "num", "W", "power draw", "tuimon_gpu_power_watts",
          dcgm=(Dcgm("DCGM_FI_DEV_POWER_USAGE"),)),
    Field("power_limit", "num", "W", "enforced power limit", "tuimon_gpu_power_limit_watts",
          dcgm=(Dcgm("DCGM_FI_DEV_POWER_MGMT_LIMIT"),)),
    Field("energy", "num", "J", "energy counter since driver load (monotonic)",
          "tuimon_gpu_energy_joules", counter=True,
          dcgm=(Dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),)),
    Field("sm_clock", "num", "Hz", "current SM clock", "tuimon_gpu_sm_clock_hertz",
          dcgm=(Dcgm("DCGM_FI_DEV_SM_CLOCK", MHZ),)),
    Field("mem_clock", "num", "Hz", "current memory clock", "tuimon_gpu_memory_clock_hertz",
          dcgm=(Dcgm("DCGM_FI_DEV_MEM_CLOCK", MHZ),)),
    Field("clock_events", "strlist", "names", "active clock-event (throttle) reasons "
          "(`/metrics`: tuimon_gpu_clock_event_active; dcgm-exporter: the bit mask "
          "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS or DCGM_FI_DEV_CLOCKS_EVENT_REASONS)"),
    Field("pstate", "int", "0..15", "performance state (P0 fastest)",
          "tuimon_gpu_performance_state", dcgm=(Dcgm("DCGM_FI_DEV_PSTATE"),)),
    Field("ecc_corrected", "int", "count", "corrected ECC errors, aggregate (lifetime)",
          "tuimon_gpu_ecc_corrected_errors", counter=True,
          dcgm=(Dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),)),
    Field("ecc_uncorrected", "int", "count", "uncorrected ECC errors, aggregate (lifetime)",
          "tuimon_gpu_ecc_uncorrected_errors", counter=True,
          dcgm=(Dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),)),
    Field("retired_pages", "int", "count", "retired pages (pre-Ampere page retirement)",
          "tuimon_gpu_retired_pages", dcgm=(Dcgm("DCGM_FI_DEV_RETIRED_SBE", add=True),
                                            Dcgm("DCGM_FI_DEV_RETIRED_DBE", add=True))),
    Field("retired_pending", "int", "0/1", "a page retirement awaits a reboot",
          "tuimon_gpu_retired_pages_pending", dcgm=(Dcgm("DCGM_FI_DEV_RETIRED_PENDING"),)),
    Field("remapped_rows", "int", "count", "remapped rows, corrected and uncorrected",
          "tuimon_gpu_remapped_rows",
          dcgm=(Dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", add=True),
                Dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", add=True))),
    Field("remap_pending", "int", "0/1", "a row remap awaits a GPU reset",
          "tuimon_gpu_remapped_rows_pending", dcgm=(Dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING"),)),
    Field("remap_failed", "int", "0/1", "a row remap failed", "tuimon_gpu_remapped_rows_failed",
          dcgm=(Dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE"),)),
    Field("pcie_tx", "num", "bytes/s", "PCIe transmit throughput",
          "tuimon_gpu_pcie_transmit_bytes_per_second",
          dcgm=(Dcgm("DCGM_FI_PROF_PCIE_TX_BYTES"),
                Dcgm("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 1024.0))),  # KB/s, before DCP
    Field("pcie_rx", "num", "bytes/s", "PCIe receive throughput",
          "tuimon_gpu_pcie_receive_bytes_per_second",
          dcgm=(Dcgm("DCGM_FI_PROF_PCIE_RX_BYTES"),
                Dcgm("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 1024.0))),
    Field("nvlink_tx", "num", "bytes/s", "NVLink transmit data rate, from the data counter"),
    Field("nvlink_rx", "num", "bytes/s", "NVLink receive data rate, from the data counter"),
    Field("nvlink_tx_total", "int", "bytes", "NVLink transmit data counter",
          "tuimon_gpu_nvlink_transmit_bytes", counter=True),
    Field("nvlink_rx_total", "int", "bytes", "NVLink receive data counter",
          "tuimon_gpu_nvlink_receive_bytes", counter=True),
    Field("procs", "int", "count", "compute processes on the GPU", "tuimon_gpu_processes"),
    Field("proc_mem", "int", "bytes", "device memory used by those processes",
          "tuimon_gpu_process_memory_bytes"),
    Field("xid_total", "int", "count", "XID errors seen by this agent since it started",
          "tuimon_gpu_xid_errors", counter=True),
    Field("last_xid", "int", "code", "the most recent XID code seen, nil when none",
          "tuimon_gpu_last_xid", dcgm=(Dcgm("DCGM_FI_DEV_XID_ERRORS"),)),
    Field("processes", "maplist", "processes", "the compute processes (at most 16, the "
          "largest memory users first), each a map: `pid`, `mem` (bytes of GPU memory), "
          "and where /proc tells: `user`, `command`, `job` (Slurm job id, from the "
          "cgroup), `pod_uid`, `namespace` and `pod` (Kubernetes), `container` (12 "
          "characters of its id) and `runtime` (containerd, crio, docker)"),
    Field("mig_mode", "int", "0/1", "1 when the GPU is partitioned into MIG instances",
          "tuimon_gpu_mig_mode"),
    Field("mig", "maplist", "instances", "MIG instances, each a map: `gi` (GPU instance id), "
          "`ci` (compute instance id or nil), `profile` (e.g. `2g.20gb`), `uuid`, "
          "`mem_used`, `mem_total` (bytes), `procs`, `processes` (as the GPU's), and where "
          "known `gr_active`, "
          "`sm_active`, `tensor_active`, `dram_active` (ratios); the GPU's own values "
          "stand for the whole GPU (memory summed, power once)"),
    Field("failed", "str", "reason", "set when the GPU could not be read at all (e.g. GPU lost)"),
    Field("errors", "dict", "field -> reason", "fields that failed to read for a reason other "
          "than 'not supported'"),
)

HOST_FIELDS: tuple[Field, ...] = (
    Field("cpu_util", "num", "ratio 0..1", "CPU busy time over the last interval, all cores",
          "tuimon_host_cpu_utilization_ratio"),
    Field("cpus", "int", "count", "online logical CPUs", "tuimon_host_cpus"),
    Field("load1", "num", "runnable tasks", "1-minute load average", "tuimon_host_load1",
          node_exporter="node_load1"),
    Field("load5", "num", "runnable tasks", "5-minute load average", "tuimon_host_load5",
          node_exporter="node_load5"),
    Field("load15", "num", "runnable tasks", "15-minute load average", "tuimon_host_load15",
          node_exporter="node_load15"),
    Field("mem_total", "int", "bytes", "physical memory", "tuimon_host_memory_total_bytes",
          node_exporter="node_memory_MemTotal_bytes"),
    Field("mem_available", "int", "bytes", "memory available without swapping (MemAvailable)",
          "tuimon_host_memory_available_bytes",
          node_exporter="node_memory_MemAvailable_bytes"),
    Field("mem_used", "int", "bytes", "mem_total - mem_available",
          "tuimon_host_memory_used_bytes"),
    Field("uptime", "num", "s", "time since boot", "tuimon_host_uptime_seconds"),
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

FAMILIES: tuple[str, ...] = ("gpu", "host", "fabric", "storage", "steps", "events", "overview",
                             "findings")


# The overview's compact sections (docs/protocol.md, "overview"). Level blobs hold their
# metrics in these orders; a newer agent appends metrics, never reorders them.
GPU_LEVEL_ORDER: tuple[str, ...] = ("util", "mem", "temp", "power", "clock", "health")
FABRIC_LEVEL_ORDER: tuple[str, ...] = ("util", "congestion", "errors")
# A shared file system in `fs_rows`; a newer agent may add columns after these.
FS_COLUMNS: tuple[str, ...] = ("id", "fstype", "read", "write", "md_ops", "size", "free")
