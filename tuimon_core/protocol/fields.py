"""The one name table of protocol v1: every field of every message and family, with its
type, bounds, unit and meaning, and the names it goes by elsewhere.

This table is the wire's schema. The decoder checks every value against its field's
type (`tuimon_core/protocol/schema.py`), the agent fits what it sends to the same types,
`/metrics` takes its names from here, `tuimon prom` maps Prometheus names back through
it, and docs/protocol.md lists its rows (tests/test_docs.py checks every row).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuimon_core.hostlist import MAX_HOSTLIST_CHARS
from tuimon_core.protocol.schema import (
    MAX_STR,
    AnyOf,
    Int,
    ListOf,
    MapOf,
    Num,
    Record,
    Str,
    WireType,
)


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
    """One value on the wire: its key, type, SI unit and meaning, and the names it goes by
    elsewhere: the agent's `/metrics` name (without `_total` for counters; the client
    library appends it), dcgm-exporter's (first match wins) and node_exporter's. A
    `required` field must be present and not nil; any other may be nil (could not be
    read) or absent."""

    key: str
    type: WireType
    unit: str
    doc: str
    metric: str | None = None
    counter: bool = False
    dcgm: tuple[Dcgm, ...] = ()
    node_exporter: str | None = None
    required: bool = False
    help: str | None = None  # the `/metrics` HELP text, where it is not `doc`

    @property
    def kind(self) -> str:
        """The type as docs/protocol.md spells it (`num`, `int`, `str`, `[str]`, ...)."""
        return self.type.doc

    def doc_row(self) -> str:
        """The field's row in docs/protocol.md's tables (tests/test_docs.py checks each)."""
        kind = f"{self.kind}, required" if self.required else self.kind
        return f"| `{self.key}` | {kind} | {self.unit} | {self.doc} |"

    @property
    def metric_help(self) -> str:
        """The metric's HELP text in the agent's `/metrics`."""
        return self.help or self.doc

    @property
    def exposed(self) -> str | None:
        """The name as Prometheus stores it (counters with `_total`)."""
        if self.metric is None:
            return None
        return self.metric + "_total" if self.counter else self.metric


MIB = float(1 << 20)
MHZ = 1e6
# NVML's PCIe throughput (nvmlDeviceGetPcieThroughput, and DCGM's
# DCGM_FI_DEV_PCIE_*_THROUGHPUT that carries it) is in "KB/s" of 1024 bytes, as nvitop
# reads it: the agent's fallback and the DCGM mapping both scale by this.
NVML_PCIE_KB = 1024.0

# -- bounds: what one node's frame may hold --------------------------------------------
# Counts the wire allows and the agent cuts to. A frame must also fit MAX_MESSAGE_BYTES
# (codec.py): the agent measures that too (agent/frame_fit.py).
# No bound is tighter than what readers of earlier releases accepted: an agent that
# predates the schema never sends what an upgraded viewer refuses.
MAX_GPUS = 64
MAX_PROCESSES = 64  # per GPU or MIG instance (the agent sends its 16 largest users)
MAX_MIG = 64
MAX_ENTITIES = 4096  # ports, NICs, file systems, disks, a job's ranks, a node's jobs
MAX_PORTS = MAX_NICS = MAX_FILESYSTEMS = MAX_DISKS = MAX_ENTITIES
MAX_SHARED_FS = 256  # rows of the overview
MAX_FINDINGS = 256
MAX_FINDING_TEXT = 512
MAX_JOBS = MAX_RANKS = MAX_ENTITIES
MAX_BUDGET_JOBS = 1024  # in a relay's batch: the jobs seen most recently
# Nodes one viewer may take whole through a relay at once (a node screen, a short list).
MAX_DETAIL = 256
# A count that is summed (steps, samples, tokens): exact in a float, and a sum of many
# stays far within msgpack's 64 bits.
MAX_COUNT = 1 << 53
MAX_KIND = 64  # a finding's kind

# -- the types most fields have ---------------------------------------------------------
NUM = Num()  # any finite number within +-MAX_NUM
RATE = Num(lo=0)  # a rate or a ratio: never negative
# A Unix time: after 1970 and before the year 5000, so every clock and calendar function
# a reader passes it to can represent it.
TIME = Num(0, 95e9, doc="time")
# A sampling interval, as the agent takes it (--interval): a reader divides by it.
INTERVAL = Num(0.01, 3600)
INT = Int()
COUNT = Int(hi=MAX_COUNT, doc="count")  # summed by readers: see MAX_COUNT
STR = Str()
SEVERITIES = ("info", "warning", "critical")
# The pause a RoCE port sends (port `pause_by`): per priority (PFC), 802.3x global, both.
PAUSE_KINDS = ("pfc", "global", "pfc+global")
SEVERITY = Str(choices=SEVERITIES, doc="severity")
CLOCK_EVENTS = ListOf(STR, 64)
REASONS = MapOf(STR, 64)  # name -> why it could not be read

PROCESS_FIELDS: tuple[Field, ...] = (
    Field("pid", INT, "", "host process id (as NVML reports it)", required=True),
    Field("mem", INT, "bytes", "GPU memory it uses, nil when NVML cannot say"),
    Field("user", STR, "", "user name from the node's /etc/passwd, else the uid"),
    Field("command", STR, "", "command line (its first 160 characters)"),
    Field("job", STR, "", "Slurm job id, from the process's cgroup"),
    Field("pod_uid", STR, "", "Kubernetes pod uid, from the cgroup"),
    Field("namespace", STR, "", "Kubernetes namespace"),
    Field("pod", STR, "", "Kubernetes pod name"),
    Field("container", STR, "", "container id (its first 12 characters)"),
    Field("runtime", STR, "", "container runtime: containerd, crio, docker, podman"),
)
PROCESS = Record("process", PROCESS_FIELDS)

MIG_FIELDS: tuple[Field, ...] = (
    Field("gi", INT, "", "GPU instance id", required=True),
    Field("ci", INT, "", "compute instance id"),
    Field("profile", STR, "", "profile, e.g. `2g.20gb`"),
    Field("uuid", STR, "", "MIG device UUID"),
    Field("mem_used", INT, "bytes", "instance memory in use"),
    Field("mem_total", INT, "bytes", "instance memory"),
    Field("procs", INT, "count", "compute processes in the instance"),
    Field("proc_mem", INT, "bytes", "memory those processes use"),
    Field("processes", ListOf(PROCESS, MAX_PROCESSES), "processes", "as the GPU's"),
    Field("gr_active", RATE, "ratio 0..1", "engine active (DCGM profiling)"),
    Field("sm_active", RATE, "ratio 0..1", "SM active (DCGM profiling)"),
    Field("tensor_active", RATE, "ratio 0..1", "tensor pipe active (DCGM profiling)"),
    Field("dram_active", RATE, "ratio 0..1", "memory interface active (DCGM profiling)"),
    Field("errors", REASONS, "field -> reason", "values that could not be read"),
)
MIG = Record("mig", MIG_FIELDS)

# -- PCIe paths: the links from a GPU or HCA up to its root port (since 2026-12) -----------
MAX_PCIE_HOPS = 16  # links on one path (a real one has 1 to 3)
GEN = Int(hi=16)
LANES = Int(hi=64)
PCIE_HOP_FIELDS: tuple[Field, ...] = (
    Field("up", STR, "", "the port above the link, as a PCI address (`0000:17:01.0`): a "
          "root port or a switch's downstream port"),
    Field("down", STR, "", "the device below it: the GPU or HCA itself (the path's first "
          "link), else a switch's upstream port"),
    Field("up_kind", Str(choices=("root", "switch")), "", "`root`: the port above is a "
          "root port (the link's top is the CPU); `switch`: a switch's downstream port"),
    Field("up_gen_max", GEN, "generation", "the most the port above supports (sysfs "
          "`max_link_speed`)"),
    Field("up_width_max", LANES, "lanes", "the widest the port above supports"),
    Field("down_gen_max", GEN, "generation", "the most the device below supports"),
    Field("down_width_max", LANES, "lanes", "the widest the device below supports"),
    Field("gen", GEN, "generation", "the link's generation now (`current_link_speed`), as "
          "last read: an HCA's path; a GPU's links now travel in each sample "
          "(`pcie_path_gen`)"),
    Field("width", LANES, "lanes", "the link's width now, as `gen`"),
)
PCIE_PATH = ListOf(Record("pcie hop", PCIE_HOP_FIELDS), MAX_PCIE_HOPS)

GPU_FIELDS: tuple[Field, ...] = (
    Field("util", NUM, "ratio 0..1", "GPU utilization over the driver's sample period "
          "(NVML: the share of time a kernel ran, on any SM)",
          "tuimon_gpu_utilization_ratio", dcgm=(Dcgm("DCGM_FI_DEV_GPU_UTIL", 0.01),)),
    Field("mem_util", NUM, "ratio 0..1", "memory controller utilization",
          "tuimon_gpu_memory_utilization_ratio",
          dcgm=(Dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", 0.01),)),
    Field("gr_active", NUM, "ratio 0..1", "graphics/compute engine active (DCGM "
          "profiling); in MIG mode, per instance", "tuimon_gpu_engine_active_ratio",
          dcgm=(Dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE"),)),
    Field("sm_active", NUM, "ratio 0..1", "SMs with at least one warp resident, averaged "
          "over all SMs (DCGM profiling): a truer busy measure than `util`",
          "tuimon_gpu_sm_active_ratio", dcgm=(Dcgm("DCGM_FI_PROF_SM_ACTIVE"),)),
    Field("tensor_active", NUM, "ratio 0..1", "tensor pipe active (DCGM profiling)",
          "tuimon_gpu_tensor_active_ratio", dcgm=(Dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),)),
    Field("dram_active", NUM, "ratio 0..1", "device memory interface active (DCGM "
          "profiling)", "tuimon_gpu_dram_active_ratio",
          dcgm=(Dcgm("DCGM_FI_PROF_DRAM_ACTIVE"),)),
    Field("mem_used", INT, "bytes", "device memory in use", "tuimon_gpu_memory_used_bytes",
          dcgm=(Dcgm("DCGM_FI_DEV_FB_USED", MIB),)),
    Field("mem_total", INT, "bytes", "device memory total", "tuimon_gpu_memory_total_bytes",
          dcgm=(Dcgm("DCGM_FI_DEV_FB_TOTAL", MIB),)),
    Field("mem_reserved", INT, "bytes", "device memory the driver reserves",
          "tuimon_gpu_memory_reserved_bytes", dcgm=(Dcgm("DCGM_FI_DEV_FB_RESERVED", MIB),)),
    Field("temp", NUM, "°C", "GPU core temperature", "tuimon_gpu_temperature_celsius",
          dcgm=(Dcgm("DCGM_FI_DEV_GPU_TEMP"),)),
    Field("power", NUM, "W", "power draw", "tuimon_gpu_power_watts",
          dcgm=(Dcgm("DCGM_FI_DEV_POWER_USAGE"),)),
    Field("power_limit", NUM, "W", "enforced power limit", "tuimon_gpu_power_limit_watts",
          dcgm=(Dcgm("DCGM_FI_DEV_POWER_MGMT_LIMIT"),)),
    Field("energy", NUM, "J", "energy counter since driver load (monotonic)",
          "tuimon_gpu_energy_joules", counter=True,
          dcgm=(Dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),)),
    Field("sm_clock", NUM, "Hz", "current SM clock", "tuimon_gpu_sm_clock_hertz",
          dcgm=(Dcgm("DCGM_FI_DEV_SM_CLOCK", MHZ),)),
    Field("mem_clock", NUM, "Hz", "current memory clock", "tuimon_gpu_memory_clock_hertz",
          dcgm=(Dcgm("DCGM_FI_DEV_MEM_CLOCK", MHZ),)),
    Field("clock_events", CLOCK_EVENTS, "names", "active clock-event (throttle) reasons "
          "(`/metrics`: tuimon_gpu_clock_event_active; dcgm-exporter: the bit mask "
          "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS or DCGM_FI_DEV_CLOCKS_EVENT_REASONS)"),
    Field("pstate", INT, "0..15", "performance state (P0 fastest)",
          "tuimon_gpu_performance_state", dcgm=(Dcgm("DCGM_FI_DEV_PSTATE"),)),
    Field("ecc_corrected", INT, "count", "corrected ECC errors, aggregate (lifetime)",
          "tuimon_gpu_ecc_corrected_errors", counter=True,
          dcgm=(Dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),)),
    Field("ecc_uncorrected", INT, "count", "uncorrected ECC errors, aggregate (lifetime)",
          "tuimon_gpu_ecc_uncorrected_errors", counter=True,
          dcgm=(Dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),)),
    Field("retired_pages", INT, "count", "retired pages (pre-Ampere page retirement)",
          "tuimon_gpu_retired_pages", dcgm=(Dcgm("DCGM_FI_DEV_RETIRED_SBE", add=True),
                                            Dcgm("DCGM_FI_DEV_RETIRED_DBE", add=True))),
    Field("retired_pending", INT, "0/1", "a page retirement awaits a reboot",
          "tuimon_gpu_retired_pages_pending", dcgm=(Dcgm("DCGM_FI_DEV_RETIRED_PENDING"),)),
    Field("remapped_rows", INT, "count", "remapped rows, corrected and uncorrected",
          "tuimon_gpu_remapped_rows",
          dcgm=(Dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", add=True),
                Dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", add=True))),
    Field("remap_pending", INT, "0/1", "a row remap awaits a GPU reset",
          "tuimon_gpu_remapped_rows_pending", dcgm=(Dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING"),)),
    Field("remap_failed", INT, "0/1", "a row remap failed", "tuimon_gpu_remapped_rows_failed",
          dcgm=(Dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE"),)),
    Field("pcie_tx", NUM, "bytes/s", "PCIe transmit throughput",
          "tuimon_gpu_pcie_transmit_bytes_per_second",
          dcgm=(Dcgm("DCGM_FI_PROF_PCIE_TX_BYTES"),
                Dcgm("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", NVML_PCIE_KB))),  # before DCP
    Field("pcie_rx", NUM, "bytes/s", "PCIe receive throughput",
          "tuimon_gpu_pcie_receive_bytes_per_second",
          dcgm=(Dcgm("DCGM_FI_PROF_PCIE_RX_BYTES"),
                Dcgm("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", NVML_PCIE_KB))),
    Field("pcie_gen", GEN, "generation", "current PCIe link generation (an idle GPU "
          "may run a lower one to save power)", "tuimon_gpu_pcie_link_generation",
          dcgm=(Dcgm("DCGM_FI_DEV_PCIE_LINK_GEN"),)),
    Field("pcie_width", LANES, "lanes", "current PCIe link width",
          "tuimon_gpu_pcie_link_width", dcgm=(Dcgm("DCGM_FI_DEV_PCIE_LINK_WIDTH"),)),
    Field("pcie_replays", INT, "count", "PCIe replays since the driver loaded (link-level "
          "retries)", "tuimon_gpu_pcie_replays", counter=True,
          dcgm=(Dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),)),
    Field("pcie_path_gen", ListOf(GEN, MAX_PCIE_HOPS, nil=True), "generations", "each link "
          "of the GPU's `pcie_path` (hello) now, in its order; nil where not read (since "
          "2026-12)"),
    Field("pcie_path_width", ListOf(LANES, MAX_PCIE_HOPS, nil=True), "lanes", "each link's "
          "width now, as `pcie_path_gen`"),
    Field("nvlink_replay_errors", INT, "count", "NVLink replay errors, all links",
          "tuimon_gpu_nvlink_replay_errors", counter=True,
          dcgm=(Dcgm("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),)),
    Field("nvlink_recovery_errors", INT, "count", "NVLink recovery errors (a link retrained), "
          "all links", "tuimon_gpu_nvlink_recovery_errors", counter=True,
          dcgm=(Dcgm("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),)),
    Field("nvlink_crc_errors", INT, "count", "NVLink CRC errors (flow control and data), all "
          "links", "tuimon_gpu_nvlink_crc_errors", counter=True,
          dcgm=(Dcgm("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", add=True),
                Dcgm("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", add=True))),
    Field("nvlink_tx", NUM, "bytes/s", "NVLink transmit data rate, from the data counter"),
    Field("nvlink_rx", NUM, "bytes/s", "NVLink receive data rate, from the data counter"),
    Field("nvlink_tx_total", INT, "bytes", "NVLink transmit data counter",
          "tuimon_gpu_nvlink_transmit_bytes", counter=True),
    Field("nvlink_rx_total", INT, "bytes", "NVLink receive data counter",
          "tuimon_gpu_nvlink_receive_bytes", counter=True),
    Field("procs", INT, "count", "compute processes on the GPU", "tuimon_gpu_processes"),
    Field("proc_mem", INT, "bytes", "device memory used by those processes",
          "tuimon_gpu_process_memory_bytes"),
    Field("xid_total", INT, "count", "XID errors seen by this agent since it started",
          "tuimon_gpu_xid_errors", counter=True),
    Field("last_xid", INT, "code", "the most recent XID code seen, nil when none",
          "tuimon_gpu_last_xid", dcgm=(Dcgm("DCGM_FI_DEV_XID_ERRORS"),)),
    Field("processes", ListOf(PROCESS, MAX_PROCESSES), "processes", "the compute "
          "processes, the largest memory users first (`process`, below)"),
    Field("mig_mode", INT, "0/1", "1 when the GPU is partitioned into MIG instances",
          "tuimon_gpu_mig_mode"),
    Field("mig", ListOf(MIG, MAX_MIG), "instances", "MIG instances (`mig`, below); the "
          "GPU's own values stand for the whole GPU (memory summed, power once)"),
    Field("failed", STR, "reason", "set when the GPU could not be read at all (e.g. GPU lost)"),
    Field("errors", REASONS, "field -> reason", "fields that failed to read for a reason other "
          "than 'not supported'"),
)

HOST_FIELDS: tuple[Field, ...] = (
    Field("cpu_util", NUM, "ratio 0..1", "CPU busy time over the last interval, all cores",
          "tuimon_host_cpu_utilization_ratio"),
    Field("cpus", INT, "count", "online logical CPUs", "tuimon_host_cpus"),
    Field("load1", NUM, "runnable tasks", "1-minute load average", "tuimon_host_load1",
          node_exporter="node_load1"),
    Field("load5", NUM, "runnable tasks", "5-minute load average", "tuimon_host_load5",
          node_exporter="node_load5"),
    Field("load15", NUM, "runnable tasks", "15-minute load average", "tuimon_host_load15",
          node_exporter="node_load15"),
    Field("mem_total", INT, "bytes", "physical memory", "tuimon_host_memory_total_bytes",
          node_exporter="node_memory_MemTotal_bytes"),
    Field("mem_available", INT, "bytes", "memory available without swapping (MemAvailable)",
          "tuimon_host_memory_available_bytes",
          node_exporter="node_memory_MemAvailable_bytes"),
    Field("mem_used", INT, "bytes", "mem_total - mem_available",
          "tuimon_host_memory_used_bytes"),
    Field("uptime", NUM, "s", "time since boot", "tuimon_host_uptime_seconds"),
    Field("errors", REASONS, "field -> reason", "host fields that could not be read, and why"),
)

GPU = Record("gpu", GPU_FIELDS)
HOST = Record("host", HOST_FIELDS)

GPU_INFO_FIELDS: tuple[Field, ...] = (
    Field("index", Int(hi=MAX_GPUS - 1), "", "NVML device index", required=True),
    Field("uuid", STR, "", "GPU UUID"),
    Field("name", STR, "", "product name"),
    Field("mem_total", INT, "bytes", "device memory"),
    Field("power_limit", NUM, "W", "power management limit"),
    Field("pci_bus_id", STR, "", "PCI bus id"),
    Field("max_sm_clock", NUM, "Hz", "maximum SM clock", "tuimon_gpu_sm_clock_max_hertz",
          help="Maximum SM clock"),
    Field("max_mem_clock", NUM, "Hz", "maximum memory clock",
          "tuimon_gpu_memory_clock_max_hertz", help="Maximum memory clock"),
    Field("vbios", STR, "", "VBIOS version (since 2026-12)"),
    Field("pcie_gen_max", GEN, "generation", "the highest PCIe generation this GPU "
          "and its slot support together (NVML's `Max`: a Gen4 GPU in a Gen5 host is 4)",
          "tuimon_gpu_pcie_link_generation_max",
          help="The highest PCIe generation the GPU and its slot support together"),
    Field("pcie_width_max", LANES, "lanes", "the widest PCIe link the GPU and slot "
          "support", "tuimon_gpu_pcie_link_width_max",
          help="The widest PCIe link the GPU and its slot support"),
    Field("nvlinks", Int(hi=64), "links", "NVLinks active (nil: the GPU has none, or NVML "
          "cannot say)", "tuimon_gpu_nvlinks_active", help="NVLinks active"),
    Field("nvlinks_total", Int(hi=64), "links", "NVLinks the GPU has, active or not",
          "tuimon_gpu_nvlinks", help="NVLinks the GPU has"),
    Field("pcie_path", PCIE_PATH, "links", "the PCIe links from the GPU up to its root port, "
          "its own first (`pcie_path[]`, below), read from sysfs with the inventory; nil "
          "where not read (since 2026-12)"),
)

GPU_INFO = Record("gpu info", GPU_INFO_FIELDS)
# The inventory's GPU facts the agent's `/metrics` exports (labels node, gpu, uuid):
# (key, metric name, HELP); and by key their names.
GPU_INFO_METRICS: tuple[tuple[str, str, str], ...] = tuple(
    (f.key, f.metric, f.metric_help) for f in GPU_INFO_FIELDS if f.metric)
GPU_INFO_METRIC: dict[str, str] = {key: name for key, name, _ in GPU_INFO_METRICS}
# 1 when the GPU could be read, 0 when it failed (a sample's `failed`), in `/metrics`.
GPU_UP_METRIC = "tuimon_gpu_up"

# -- fabric ------------------------------------------------------------------------------

PORT_INFO_FIELDS: tuple[Field, ...] = (
    Field("id", STR, "", "`device:port`, e.g. `mlx5_0:1`", required=True),
    Field("device", STR, "", "the HCA, e.g. `mlx5_0`"),
    Field("port", AnyOf(INT, STR, doc="int or str"), "", "port number (the "
          "directory's name where it is not a number)"),
    Field("link_layer", STR, "", "`InfiniBand`, or `Ethernet` for RoCE"),
    Field("rate", RATE, "bytes/s", "link rate, from `400 Gb/sec (4X NDR)`"),
    Field("rate_text", STR, "", "the rate as read"),
    Field("hca_type", STR, "", "HCA model, e.g. `MT4129`"),
    Field("board_id", STR, "", "board id, e.g. `MT_0000000838`"),
    Field("fw_ver", STR, "", "firmware version"),
    Field("netdev", STR, "", "the Ethernet device behind a RoCE port, or nil"),
    Field("up", Int(hi=1), "0/1", "1 when the port is ACTIVE and LinkUp (sent again when "
          "that changes): only then is `rate` a rate (a Down port reads one, `40`); nil: "
          "its state could not be read"),
    Field("pcie_gen", GEN, "generation", "the HCA's PCIe link generation, from "
          "sysfs `current_link_speed` (since 2026-12)", "tuimon_hca_pcie_link_generation",
          help="The HCA's PCIe link generation"),
    Field("pcie_width", LANES, "lanes", "the HCA's PCIe link width",
          "tuimon_hca_pcie_link_width", help="The HCA's PCIe link width"),
    Field("pcie_gen_max", GEN, "generation", "the most the HCA itself supports "
          "(`max_link_speed`); its link trains at most at the lower of this and its slot's "
          "(`pcie_path`)", "tuimon_hca_pcie_link_generation_max",
          help="The HCA's PCIe link generation at most"),
    Field("pcie_width_max", LANES, "lanes", "the widest the HCA itself supports",
          "tuimon_hca_pcie_link_width_max", help="The HCA's PCIe link width at most"),
    Field("pcie_path", PCIE_PATH, "links", "the PCIe links from the HCA up to its root port, "
          "its own first, each with its state now (`pcie_path[]`, below), read with the "
          "link rate (since 2026-12)"),
)
NIC_INFO_FIELDS: tuple[Field, ...] = (
    Field("id", STR, "", "interface name, e.g. `eth0`", required=True),
    Field("speed", RATE, "bytes/s", "link speed"),
)
PORT_COUNTERS = MapOf(Int(), 32)  # counter -> increment, nil: could not be counted
PORT_FIELDS: tuple[Field, ...] = (
    Field("id", STR, "", "as the inventory's", required=True),
    Field("state", INT, "", "as read: `4: ACTIVE` is 4"),
    Field("state_name", STR, "", "as read: `ACTIVE`"),
    Field("phys_state", INT, "", "as read: `5: LinkUp` is 5"),
    Field("phys_state_name", STR, "", "as read: `LinkUp`"),
    Field("tx_bytes_s", RATE, "bytes/s", "data rate (`port_xmit_data` x 4 / s)"),
    Field("rx_bytes_s", RATE, "bytes/s", "data rate (`port_rcv_data` x 4 / s)"),
    Field("tx_packets_s", RATE, "packets/s", "packets sent"),
    Field("rx_packets_s", RATE, "packets/s", "packets received"),
    Field("xmit_wait_s", RATE, "ticks/s", "`port_xmit_wait` per second: congestion (no "
          "credits to send)"),
    Field("tx_util", RATE, "ratio 0..1", "data rate over link rate"),
    Field("rx_util", RATE, "ratio 0..1", "data rate over link rate"),
    Field("errors_inc", PORT_COUNTERS, "counter -> count", "increments since the previous "
          "read of the error counters (every 5 samples, and at once when the link leaves "
          "ACTIVE), only for counters that moved or could not be counted (nil; not a "
          "counter the port has no file of): "
          "`symbol_errors`, `rcv_errors`, `remote_physical_errors`, `xmit_discards`, "
          "`link_downed`, `link_error_recovery`, `buffer_overruns`, "
          "`local_link_integrity_errors`. Absent: nothing moved"),
    Field("saturated", ListOf(STR, 64), "counters", "legacy counters stuck at their "
          "maximum: their rates and increments are nil"),
    Field("hw", MapOf(RATE, 64), "counter -> 1/s", "mlx5 `hw_counters` rates "
          "(`np_cnp_sent`, `rp_cnp_handled`, `np_ecn_marked_roce_packets`, "
          "`out_of_sequence`, `packet_seq_err`, `local_ack_timeout_err`, "
          "`rnr_nak_retry_err`, `out_of_buffer`, ...), read across their 2^32 wrap; the "
          "sequence-error and retransmission ones are read every few samples, their rate "
          "over those seconds"),
    Field("counter_errors", REASONS, "counter -> reason", "counters that could not be read: "
          "`N/A (no PMA)`, `missing`, `permission denied`, `not a counter: ...`, `ethtool` "
          "(a RoCE netdev's driver statistics)"),
    Field("pause_rx_s", RATE, "frames/s", "RoCE: PFC and global pause frames received (the "
          "peer asks this port to stop), all priorities (since 2026-12)"),
    Field("pause_tx_s", RATE, "frames/s", "RoCE: pause frames sent (this port asks its peer "
          "to stop)"),
    Field("paused_rx", Num(0, 1), "ratio 0..1", "RoCE: the share of the interval the peer held "
          "this port off (`*_pause_duration`, microseconds)"),
    Field("paused_tx", Num(0, 1), "ratio 0..1", "RoCE: the share of the interval this port "
          "held its peer off: a receiver that cannot keep up"),
    Field("pause_storms", COUNT, "count", "RoCE: PFC storm watchdog events since the last "
          "read (`tx_pause_storm_warning_events`, `tx_pause_storm_error_events`)"),
    Field("admin_up", Int(hi=1), "0/1", "RoCE, a port that is not up: 1 when its netdev "
          "is administratively up (`IFF_UP` in `/sys/class/net/<netdev>/flags`: no carrier, "
          "a link fault), 0 when it was set down; the RDMA port reads Disabled both ways"),
    Field("pause_by", Str(choices=PAUSE_KINDS), "", "RoCE: the pause this port sent to its "
          "peer this interval, by whose `tx_*_pause_duration` counters moved: `pfc` "
          "(per-priority), `global` (802.3x), `pfc+global`; nil: none"),
    Field("pfc", ListOf(Int(hi=7), 8), "priorities", "RoCE: the priorities with PFC on "
          "(the driver lists their pause counters): the lossless traffic classes; empty: "
          "none"),
    Field("discards_s", RATE, "packets/s", "RoCE: packets dropped for lack of receive "
          "buffer, each counted once: `rx_prio<N>_discards` summed where listed, else "
          "`rx_discards_phy`"),
    Field("arrived_s", RATE, "packets/s", "RoCE: packets that reached the port, kept or "
          "dropped, from the same counters (`rx_prio<N>_packets` + `rx_prio<N>_discards`, "
          "else `rx_packets_phy`): what `discards_s` is a share of"),
    Field("lossless_discards_s", RATE, "packets/s", "RoCE: `discards_s` on the PFC "
          "priorities only: lossless traffic lost"),
    Field("lossless_arrived_s", RATE, "packets/s", "RoCE: `arrived_s` on the PFC priorities "
          "only"),
)
NIC_FIELDS: tuple[Field, ...] = (
    Field("id", STR, "", "as the inventory's", required=True),
    Field("operstate", STR, "", "`up`, `down`, ... as read"),
    Field("rx_bytes_s", RATE, "bytes/s", "bytes received"),
    Field("tx_bytes_s", RATE, "bytes/s", "bytes sent"),
    Field("rx_packets_s", RATE, "packets/s", "packets received"),
    Field("tx_packets_s", RATE, "packets/s", "packets sent"),
    Field("rx_errors_s", RATE, "1/s", "receive errors"),
    Field("tx_errors_s", RATE, "1/s", "transmit errors"),
    Field("rx_dropped_s", RATE, "1/s", "received packets dropped"),
    Field("tx_dropped_s", RATE, "1/s", "sent packets dropped"),
    Field("rx_util", RATE, "ratio 0..1", "receive rate over link speed"),
    Field("tx_util", RATE, "ratio 0..1", "send rate over link speed"),
    Field("counter_errors", REASONS, "counter -> reason", "counters that could not be read"),
)
@dataclass(frozen=True, slots=True)
class Counter:
    """A cumulative counter the agent reads from a file: the total it exports on
    `/metrics` (`metric`, to which the client library appends `_total`), node_exporter's
    name for the same total, and how it reaches the wire: as a rate (`<key>_s`), or for
    error counters as increments in `errors_inc`. `scale` turns the file's unit into the
    metric's (IB data counters count 4-byte words); a legacy PMA counter of `width` bits
    saturates; `ext_file` is its 64-bit twin in `counters_ext` where the driver has one."""

    key: str
    file: str
    metric: str
    doc: str
    node_exporter: str | None = None
    rate: bool = True
    width: int | None = None
    ext_file: str | None = None
    scale: int = 1


PORT_COUNTERS_READ: tuple[Counter, ...] = (
    Counter("tx_bytes", "port_xmit_data", "tuimon_ib_port_transmit_bytes",
            "Data transmitted, bytes", "node_infiniband_port_data_transmitted_bytes_total",
            width=32, ext_file="port_xmit_data_64", scale=4),
    Counter("rx_bytes", "port_rcv_data", "tuimon_ib_port_receive_bytes",
            "Data received, bytes", "node_infiniband_port_data_received_bytes_total",
            width=32, ext_file="port_rcv_data_64", scale=4),
    Counter("tx_packets", "port_xmit_packets", "tuimon_ib_port_transmit_packets",
            "Packets transmitted", "node_infiniband_port_packets_transmitted_total",
            width=32, ext_file="port_xmit_packets_64"),
    Counter("rx_packets", "port_rcv_packets", "tuimon_ib_port_receive_packets",
            "Packets received", "node_infiniband_port_packets_received_total",
            width=32, ext_file="port_rcv_packets_64"),
    Counter("xmit_wait", "port_xmit_wait", "tuimon_ib_port_transmit_wait",
            "Ticks with data to send but no credits",
            "node_infiniband_port_transmit_wait_total", width=32),
    Counter("symbol_errors", "symbol_error", "tuimon_ib_port_symbol_errors", "Symbol errors",
            "node_infiniband_symbol_error_total", rate=False, width=16),
    Counter("rcv_errors", "port_rcv_errors", "tuimon_ib_port_receive_errors",
            "Packets received with errors", "node_infiniband_port_errors_received_total",
            rate=False, width=16),
    Counter("remote_physical_errors", "port_rcv_remote_physical_errors",
            "tuimon_ib_port_receive_remote_physical_errors",
            "Packets received marked bad by the sender",
            "node_infiniband_port_receive_remote_physical_errors_total", rate=False,
            width=16),
    Counter("xmit_discards", "port_xmit_discards", "tuimon_ib_port_transmit_discards",
            "Outbound packets discarded", "node_infiniband_port_discards_transmitted_total",
            rate=False, width=16),
    Counter("link_downed", "link_downed", "tuimon_ib_port_link_downed",
            "Times the link went down", "node_infiniband_link_downed_total", rate=False,
            width=8),
    Counter("link_error_recovery", "link_error_recovery",
            "tuimon_ib_port_link_error_recovery", "Successful link error recoveries",
            "node_infiniband_link_error_recovery_total", rate=False, width=8),
    Counter("buffer_overruns", "excessive_buffer_overrun_errors",
            "tuimon_ib_port_excessive_buffer_overrun_errors", "Excessive buffer overruns",
            "node_infiniband_excessive_buffer_overrun_errors_total", rate=False, width=4),
    Counter("local_link_integrity_errors", "local_link_integrity_errors",
            "tuimon_ib_port_local_link_integrity_errors", "Local link integrity errors",
            "node_infiniband_local_link_integrity_errors_total", rate=False, width=4),
)
PORT_ERROR_COUNTERS = tuple(c.key for c in PORT_COUNTERS_READ if not c.rate)
# mlx5 RoCE congestion and retransmission counters worth a rate (32-bit, wrapping),
# exported as tuimon_ib_port_hw_counter{counter}.
HW_COUNTERS = (
    "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored", "np_ecn_marked_roce_packets",
    "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err",
    "out_of_buffer", "implied_nak_seq_err", "duplicate_request", "roce_adp_retrans",
)
# Of those, the sequence-error and retransmission counters: they move rarely, and the
# agent reads them on its error counters' cadence (their rate then covers those seconds).
# Congestion notifications and drops for lack of buffer are read every sample.
HW_ERROR_COUNTERS = frozenset({
    "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err",
    "implied_nak_seq_err", "duplicate_request", "roce_adp_retrans"})
NIC_COUNTERS_READ: tuple[Counter, ...] = tuple(
    Counter(key, f"statistics/{key}", f"tuimon_net_{metric}", doc,
            f"node_network_{metric}_total")
    for key, metric, doc in (
        ("rx_bytes", "receive_bytes", "Bytes received"),
        ("tx_bytes", "transmit_bytes", "Bytes transmitted"),
        ("rx_packets", "receive_packets", "Packets received"),
        ("tx_packets", "transmit_packets", "Packets transmitted"),
        ("rx_errors", "receive_errors", "Receive errors"),
        ("tx_errors", "transmit_errors", "Transmit errors"),
        ("rx_dropped", "receive_dropped", "Received packets dropped"),
        ("tx_dropped", "transmit_dropped", "Transmitted packets dropped")))
DISK_COUNTERS_READ: tuple[Counter, ...] = (
    Counter("read_bytes", "diskstats", "tuimon_disk_read_bytes", "Bytes read",
            "node_disk_read_bytes_total"),
    Counter("written_bytes", "diskstats", "tuimon_disk_written_bytes", "Bytes written",
            "node_disk_written_bytes_total"),
)
FS_COUNTERS_READ: tuple[Counter, ...] = (
    Counter("read_bytes", "stats", "tuimon_fs_read_bytes", "Bytes read by this client"),
    Counter("write_bytes", "stats", "tuimon_fs_write_bytes", "Bytes written by this client"),
)
# An InfiniBand port's states by number, as the kernel names them (sysfs `state` and
# `phys_state` read "4: ACTIVE", "5: LinkUp"): a port carries traffic only when ACTIVE and
# LinkUp. Readers that get the number alone (Prometheus) name it from here.
PORT_ACTIVE = 4
PORT_LINK_UP = 5
PORT_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", PORT_ACTIVE: "ACTIVE", 5: "ACTIVE_DEFER"}
PORT_DISABLED = 3
PORT_PHYS_STATES = {1: "Sleep", 2: "Polling", PORT_DISABLED: "Disabled",
                    4: "PortConfigurationTraining", PORT_LINK_UP: "LinkUp",
                    6: "LinkErrorRecovery", 7: "PhyTest"}


# A port's states when it is healthy (carries traffic). The one rule of whether a port is
# up, for every reader: the agent's `up`, the node rules, the maps, the node screen, the
# readout, and the Prometheus queries (which ask only the ports in other states).
PORT_HEALTHY = {"state": PORT_ACTIVE, "phys_state": PORT_LINK_UP}


def port_down(state: int | None, phys_state: int | None) -> bool:
    """Whether a port is known not to carry traffic: a state read and not ACTIVE, or a
    physical state read and not LinkUp. A state not read says nothing (Prometheus's
    source asks only the ports not up: a healthy port's states come unread)."""
    return state not in (None, PORT_ACTIVE) or phys_state not in (None, PORT_LINK_UP)


def port_up(state: int | None, phys_state: int | None) -> bool:
    """Whether a port carries traffic: ACTIVE, and not down (port_down; a source that
    gives the state alone, as some exporters do, is taken at it). Only then is its rate
    a rate: a Down or Disabled port still reads one (`40`)."""
    return state == PORT_ACTIVE and not port_down(state, phys_state)


def link_util(bytes_s: float | None, rate: float | None) -> float | None:
    """A port's or NIC's `tx_util` / `rx_util`: its data rate over its link rate, at most
    1 (counters read a moment apart can say a little more than the link carries), for
    the agent and the Prometheus source alike; None where either is unknown."""
    if bytes_s is None or not rate or rate <= 0:
        return None
    return min(1.0, max(0.0, bytes_s / rate))


# Gauges of a port the agent exports beside its counters, and node_exporter's names.
PORT_GAUGE_METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("rate", "tuimon_ib_port_rate_bytes_per_second", "node_infiniband_rate_bytes_per_second",
     "Link rate"),
    ("state", "tuimon_ib_port_state_id", "node_infiniband_state_id",
     "Port state (1 down, 2 init, 3 armed, 4 active)"),
    ("phys_state", "tuimon_ib_port_physical_state_id", "node_infiniband_physical_state_id",
     "Physical state (2 polling, 3 disabled, 5 link up, ...)"),
)

# Our agent's mark of a port counter it could not read this time (garbage, an I/O error,
# `N/A (no PMA)`): 1, with the counter's key in label `counter`. The counter itself is
# absent then, as a saturated one is; the mark tells a reader that absent is not 0.
PORT_UNREADABLE_METRIC = "tuimon_ib_port_counter_unreadable"

PORT_INFO = Record("port info", PORT_INFO_FIELDS)
# An HCA's PCIe link, as the agent's `/metrics` exports it (labels node, device: once an
# HCA, its ports share the link): (key, metric name, HELP).
HCA_INFO_METRICS: tuple[tuple[str, str, str], ...] = tuple(
    (f.key, f.metric, f.metric_help) for f in PORT_INFO_FIELDS if f.metric)
NIC_INFO = Record("nic info", NIC_INFO_FIELDS)
FABRIC_FIELDS: tuple[Field, ...] = (
    Field("ports", ListOf(Record("port", PORT_FIELDS), MAX_PORTS), "ports",
          "InfiniBand and RoCE ports (below)"),
    Field("nics", ListOf(Record("nic", NIC_FIELDS), MAX_NICS), "nics", "network interfaces "
          "(below)"),
    Field("errors", REASONS, "part -> reason", "what could not be read or sent (e.g. "
          "`ports_cut`: ports left out of a frame over the size limit)"),
)

# -- storage -----------------------------------------------------------------------------

FS_INFO_FIELDS: tuple[Field, ...] = (
    Field("id", STR, "", "mount point, or `lustre:<fsname>` for an unmounted Lustre "
          "client", required=True),
    Field("fstype", STR, "", "`lustre`, `gpfs`, `nfs4`, `xfs`, ...", required=True),
    Field("source", STR, "", "what is mounted: `host:/export`, `10.0.0.1@o2ib:/scratch`"),
)
DISK_INFO_FIELDS: tuple[Field, ...] = (
    Field("id", STR, "", "kernel name, e.g. `nvme0n1`", required=True),
    Field("kind", STR, "", "`disk`, `partition`, `virtual`"),
)
FS_FIELDS: tuple[Field, ...] = (
    Field("id", STR, "", "as the inventory's", required=True),
    Field("fstype", STR, "", "as the inventory's", required=True),
    Field("source", STR, "", "as the inventory's"),
    Field("mounts", ListOf(STR, MAX_ENTITIES), "paths", "Lustre: every mount point of the file "
          "system, when there are several"),
    Field("instances", INT, "count", "Lustre: llite instances summed"),
    Field("read_bytes_s", RATE, "bytes/s", "this client's reads: Lustre llite "
          "`read_bytes`, GPFS `_br_`, NFS normal plus direct I/O"),
    Field("write_bytes_s", RATE, "bytes/s", "this client's writes, as reads"),
    Field("read_ops_s", RATE, "1/s", "read calls"),
    Field("write_ops_s", RATE, "1/s", "write calls"),
    Field("metadata_ops_s", RATE, "1/s", "open, close, getattr, setattr, readdir, ... "
          "(NFS: every op but READ and WRITE)"),
    Field("latency", MapOf(RATE, 32), "op -> s", "NFS: mean execution time per operation "
          "over the interval"),
    Field("size", INT, "bytes", "statvfs, refreshed every 30 s"),
    Field("free", INT, "bytes", "statvfs"),
    Field("avail", INT, "bytes", "statvfs: free to unprivileged users"),
    Field("inodes", INT, "count", "statvfs"),
    Field("inodes_free", INT, "count", "statvfs"),
    Field("error", STR, "", "why throughput could not be read"),
    Field("capacity_error", STR, "", "why capacity could not be read (e.g. `statvfs timed "
          "out after 2 s`)"),
)
DISK_FIELDS: tuple[Field, ...] = (
    Field("id", STR, "", "as the inventory's", required=True),
    Field("kind", STR, "", "as the inventory's"),
    Field("read_bytes_s", RATE, "bytes/s", "bytes read"),
    Field("write_bytes_s", RATE, "bytes/s", "bytes written"),
    Field("read_iops", RATE, "1/s", "reads completed"),
    Field("write_iops", RATE, "1/s", "writes completed"),
    Field("await", RATE, "s", "mean time per I/O"),
    Field("busy", RATE, "ratio 0..1", "share of the interval with I/O in flight"),
)
FS_INFO = Record("file system info", FS_INFO_FIELDS)
DISK_INFO = Record("disk info", DISK_INFO_FIELDS)
STORAGE_FIELDS: tuple[Field, ...] = (
    Field("filesystems", ListOf(Record("file system", FS_FIELDS), MAX_FILESYSTEMS),
          "file systems", "mounted data file systems (below)"),
    Field("disks", ListOf(Record("disk", DISK_FIELDS), MAX_DISKS), "disks",
          "block devices (below)"),
    Field("errors", REASONS, "part -> reason", "what could not be read or sent (`mounts`, "
          "`nfs`, `disks`; `filesystems_cut`: file systems left out of a frame over the size "
          "limit)"),
)

# -- steps -------------------------------------------------------------------------------

WAITS = MapOf(RATE, 16, key_len=32, nil=False)  # kind -> seconds (tuimon_core.wait_kinds)

STEP_RANK_FIELDS: tuple[Field, ...] = (
    Field("rank", Int(hi=(1 << 31) - 1), "", "the rank in the job", required=True),
    Field("steps", COUNT, "count", "steps credited"),
    Field("wall", RATE, "s", "wall time credited"),
    Field("compute", RATE, "s", "compute time credited (not waiting)"),
    Field("samples", COUNT, "count", "samples processed"),
    Field("tokens", COUNT, "count", "tokens processed"),
    Field("waits", WAITS, "kind -> s", "the waiting (wall - compute) by what was waited on "
          "(`comm`, `data`, `checkpoint`, `other`; a kind a reader does not know counts as "
          "`other`; since 2026-12)"),
)
STEP_WINDOW_FIELDS: tuple[Field, ...] = (
    Field("s", Num(above=0, hi=86400), "s", "the window's length (60, 3600, 300)", required=True),
    Field("covered", Num(0, 86400), "s", "how much of the window the agent counted the "
          "job (less than `s` when the agent or the job started within it)", required=True),
    Field("wall", RATE, "s", "wall time credited in the window, all ranks on the node",
          required=True),
    Field("compute", RATE, "s", "compute time credited in the window", required=True),
    Field("samples", COUNT, "count", "samples processed in the window"),
    Field("waits", WAITS, "kind -> s", "waiting in the window by kind, as a rank's"),
)
STEP_TOTAL_FIELDS: tuple[Field, ...] = (
    Field("steps", COUNT, "count", "steps credited since `since`", required=True),
    Field("wall", RATE, "s", "wall time credited since `since`", required=True),
    Field("compute", RATE, "s", "compute time credited since `since`", required=True),
    Field("samples", COUNT, "count", "samples processed since `since`"),
    Field("waits", WAITS, "kind -> s", "waiting since `since` by kind, as a rank's"),
    Field("since", TIME, "s", "when the agent began counting the job (a new value: the "
          "agent restarted, or forgot the job after its ranks fell silent)", required=True),
)
STEP_DROP_FIELDS: tuple[Field, ...] = (
    Field("from", Num(0, 1), "0..1", "the SLI the job had before the drop", required=True),
    Field("held", Num(0, 86400), "s", "how long the node has judged the drop",
          required=True),
)
STEP_JOB_FIELDS: tuple[Field, ...] = (
    Field("id", STR, "", "job name (cleaned)", required=True),
    Field("world", Int(lo=1, hi=1 << 31), "ranks", "the job's world size", required=True),
    Field("lost", COUNT, "count", "reports missing from its ranks' sequence numbers"),
    Field("ranks", ListOf(Record("step rank", STEP_RANK_FIELDS), MAX_RANKS), "ranks",
          "per rank sums"),
    Field("windows", ListOf(Record("step window", STEP_WINDOW_FIELDS), 8), "windows",
          "the node's sums for the job over the last minute, the last hour and the last 5 "
          "minutes (below)"),
    Field("total", Record("step totals", STEP_TOTAL_FIELDS), "totals",
          "the node's cumulative sums for the job (below)"),
    Field("drop", Record("step drop", STEP_DROP_FIELDS), "drop",
          "the job's efficiency dropped, as this node judges it (below); absent: no drop"),
    Field("ended", COUNT, "ranks", "ranks on this node that said the run is complete "
          "(`StepReporter.finish()`): the job's silence from then is not lost time "
          "(since 2026-12)"),
)
STEPS_FIELDS: tuple[Field, ...] = (
    Field("jobs", ListOf(Record("step job", STEP_JOB_FIELDS), MAX_JOBS), "jobs",
          "per job sums since the previous sample"),
    Field("received", COUNT, "count", "datagrams counted since the agent started"),
    Field("rejected", COUNT, "count", "datagrams refused"),
    Field("lost", COUNT, "count", "reports missing"),
    Field("clipped", COUNT, "count", "reports credited less time than they claimed"),
    Field("refused", MapOf(COUNT, 16, nil=False), "reason -> count", "refused by reason"),
)

# -- findings and events -----------------------------------------------------------------

FINDING_FIELDS: tuple[Field, ...] = (
    Field("severity", SEVERITY, "", "`critical`, `warning`, `info`", required=True),
    Field("kind", Str(MAX_KIND), "", "what was found", required=True),
    Field("message", Str(MAX_FINDING_TEXT), "", "one line for people"),
    Field("gpu", Int(hi=MAX_GPUS - 1), "", "the GPU, where it is about one"),
    Field("port", STR, "", "the port, where it is about one"),
    Field("fs", STR, "", "the file system, where it is about one"),
    Field("score", Num(0, 1), "0..1", "how strongly it explains an efficiency drop"),
    Field("held", Num(0, 86400), "s", "how long the node has seen the condition hold: a "
          "reader counts the finding's hold from then (since 2026-12)"),
)
FINDING = Record("finding", FINDING_FIELDS)

EVENT_FIELDS: tuple[Field, ...] = (
    Field("ts", TIME, "s", "when it happened", required=True),
    Field("kind", STR, "", "`xid`, `ecc`, `gpu_failed`, ... (readers accept kinds "
          "they do not know)", required=True),
    Field("severity", SEVERITY, "", "`info`, `warning`, `critical`", required=True),
    Field("message", STR, "", "one line for people"),
    Field("gpu", Int(hi=MAX_GPUS - 1), "", "GPU index, when about one GPU"),
    Field("code", Int(lo=-(1 << 31), hi=(1 << 31) - 1), "", "the XID number for `xid`"),
    Field("source", STR, "", "the collector or family (`gpu`, `host`, ...)"),
)

# -- the relay's budget ------------------------------------------------------------------

MAX_CAUSE = 200  # characters of a cause's name
CAUSES = MapOf(RATE, 9, key_len=MAX_CAUSE, nil=False)  # cause -> hours
MAX_HISTORY = 240  # entries of a job's hours lost by period
# Jobs a relay's budget gives their causes and history (the most recently seen): every
# job's would make a batch of megabytes.
MAX_DETAILED_JOBS = 32

BUDGET_FIELDS: tuple[Field, ...] = (
    Field("since", TIME, "s", "Unix time of the job's first minute in the ledger"),
    Field("window_h", Num(above=0, hi=1e6), "h", "the SLO window counted over"),
    Field("consumed_h", RATE, "h", "sum of total - effective hours in the window"),
    Field("observed_h", RATE, "h", "total hours in the window"),
    Field("error_ratio", MapOf(Num(0, 1), 16), "window -> ratio", "1 - effective/total "
          "over `5m`, `30m`, `1h`, `6h`, `1d`, `3d`; nil when nothing was observed"),
    Field("error", STR, "", "why the ledger cannot write (e.g. the disk is full)"),
    Field("recovered_h", RATE, "h", "run hours the relay credited from the agents' step "
          "totals for time it missed (it was away, or samples were lost on the way), since "
          "it started (since 2026-12)"),
    Field("recovered_spent_h", WAITS, "kind -> h", "the part of `recovered_h` that was "
          "lost, by the kinds the agents' totals say the ranks waited on meanwhile; `other` "
          "where they named none or sent no waits (since 2026-12)"),
    Field("spent_h", WAITS, "kind -> h", "what `consumed_h` was spent waiting on: `comm`, "
          "`data`, `checkpoint`, `stopped` (every rank silent, until the job reports again), "
          "`other` (the rest: waiting no kind names, and recovered time whose kind the "
          "agents' totals do not name); they add up to `consumed_h` (since 2026-12)"),
    Field("best_per_gpu", RATE, "samples/s", "the job's best per-GPU throughput sustained "
          "over 10 consecutive minutes of the ledger: its yardstick where no baseline is "
          "given (since 2026-12)"),
    Field("best_at", TIME, "s", "when that best window ended"),
    Field("causes_h", MapOf(CAUSES, 8, key_len=32, nil=False), "kind -> cause -> h",
          "what each kind of `spent_h` was put down to over the window: the findings that "
          "held on the job's nodes as the relay judged them (`congestion gpu042 mlx5_0:1`, "
          "`node lost gpu042`, `no finding`), the 8 largest of a kind, the rest as `other "
          "findings`; for the 32 jobs seen most recently (since 2026-12)"),
    Field("lost_from", TIME, "s", "the hour `lost_h` starts at"),
    Field("lost_every_h", Num(above=0, hi=1e6), "h", "hours each entry of `lost_h` covers"),
    Field("lost_h", ListOf(RATE, MAX_HISTORY), "h", "hours lost (total - effective) in each "
          "period from `lost_from`, oldest first: the burn-down's history (since 2026-12)"),
    Field("stopped_since", TIME, "s", "the job's ranks all fell silent then and have not "
          "reported since (its time counts as `stopped`); absent while it runs"),
    Field("stopped_cause", STR, "", "what held on its nodes when it stopped: `node lost "
          "gpu042`, a finding, or `no finding`"),
)
BUDGET = MapOf(Record("budget", BUDGET_FIELDS), MAX_BUDGET_JOBS, key_len=MAX_STR, nil=False)

# -- the relay's judgement ---------------------------------------------------------------

MAX_JUDGED = 1024  # findings a relay sends in one judgement, the gravest first

JUDGED_FINDING_FIELDS: tuple[Field, ...] = (
    *FINDING_FIELDS[:-1],  # as a node's, but `held` counted from the true onset
    Field("node", STR, "", "the node, where it is about one"),
    Field("leaf", STR, "", "the leaf switch (`spine` for every leaf), where about one"),
    Field("job", STR, "", "the job, where it is about one"),
    Field("target", STR, "", "what reported it, where that is the component (a scrape "
          "target, an aspect of the fleet)"),
    Field("nodes", STR, "", "the nodes it names, as a host list (`gpu[001-016]`)"),
    Field("since", TIME, "s", "when its condition began (the relay's clock)",
          required=True),
    Field("held", Num(0, 1e9), "s", "how long it has held when judged"),
)
JUDGEMENT_FIELDS: tuple[Field, ...] = (
    Field("at", TIME, "s", "when the relay judged (its clock)", required=True),
    Field("findings", ListOf(Record("judged finding", JUDGED_FINDING_FIELDS), MAX_JUDGED),
          "findings", "every finding its judgement holds (below), the gravest first",
          required=True),
    Field("left_out", COUNT, "count", "findings past the bound, not sent"),
)
JUDGEMENT = Record("judgement", JUDGEMENT_FIELDS)

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

FAMILIES: tuple[str, ...] = ("gpu", "host", "fabric", "storage", "steps", "events", "overview",
                             "findings")


# A shared file system in `fs_rows`, by column; a newer agent may add columns after these.
FS_ROW_FIELDS: tuple[Field, ...] = (
    Field("id", STR, "", "mount point", required=True),
    Field("fstype", STR, "", "type"),
    Field("read", RATE, "bytes/s", "read by this node"),
    Field("write", RATE, "bytes/s", "written by this node"),
    Field("md_ops", RATE, "1/s", "metadata operations"),
    Field("size", RATE, "bytes", "size"),
    Field("free", RATE, "bytes", "free"),
)
FS_COLUMNS: tuple[str, ...] = tuple(f.key for f in FS_ROW_FIELDS)

# -- messages ----------------------------------------------------------------------------

INVENTORY_FIELDS: tuple[Field, ...] = (
    Field("gpus", ListOf(GPU_INFO, MAX_GPUS), "GPUs", "one per NVML device (below)"),
    Field("driver_version", STR, "", "NVIDIA driver release"),
    Field("gpu_status", STR, "", "why this node has no readable GPUs, e.g. `no NVIDIA "
          "driver or GPU: NVML init failed (...)`; nil when NVML works"),
    Field("ports", ListOf(PORT_INFO, MAX_PORTS), "ports", "fabric ports (below)"),
    Field("nics", ListOf(NIC_INFO, MAX_NICS), "NICs", "network interfaces (below)"),
    Field("filesystems", ListOf(FS_INFO, MAX_FILESYSTEMS), "file systems",
          "data file systems (below)"),
    Field("disks", ListOf(DISK_INFO, MAX_DISKS), "disks", "block devices (below)"),
    Field("fabric_status", STR, "", "why there are no fabric ports"),
    Field("cuda_driver_version", STR, "", "the CUDA version the driver supports, e.g. "
          "`12.4` (since 2026-12)"),
    Field("pci_gpus", ListOf(STR, MAX_GPUS * 2), "PCI addresses", "NVIDIA GPUs on the PCI "
          "bus that the NVIDIA driver holds (display and 3D controllers; not NVSwitches, not "
          "GPUs passed to VMs): what NVML should see (since 2026-12)"),
    Field("gpudirect", STR, "", "the GPUDirect RDMA module loaded (`nvidia_peermem`, "
          "`nv_peer_mem`), `none`, or nil where not read (since 2026-12)"),
    Field("steps_status", STR, "", "`off` (no step socket), the reason the step socket "
          "could not be opened, or nil (listening)"),
)
INVENTORY = Record("inventory", INVENTORY_FIELDS)
HELLO_HOST_FIELDS: tuple[Field, ...] = (
    Field("hostname", STR, "", "the host's own name (nil in a container that "
          "reads the host under --root)"),
    Field("kernel", STR, "", "kernel release (`/proc/sys/kernel/osrelease`; since 2026-12)"),
)
HELLO_HOST = Record("hello host", HELLO_HOST_FIELDS)
HELLO_FIELDS: tuple[Field, ...] = (
    Field("node", STR, "", "node name (default: the host name)", required=True),
    Field("agent_version", STR, "", "agent release", required=True),
    Field("boot_id", STR, "", "`/proc/sys/kernel/random/boot_id`: changes when the "
          "node reboots"),
    Field("interval", INTERVAL, "s", "sampling interval", required=True),
    Field("ts", TIME, "s", "when the hello was made", required=True),
    Field("families", ListOf(STR, 64), "names", "families this agent can send: "
          "`gpu`, `host`, `fabric`, `storage`, `steps`, `events`, `overview`, `findings` (an "
          "agent that does not list `overview` predates it: take it whole and build its "
          "overview yourself)"),
    Field("inventory", INVENTORY, "", "what the node has (below)"),
    Field("host", HELLO_HOST, "", "static host facts"),
)
FAMILY_TYPES: dict[str, WireType] = {
    "fabric": Record("fabric", FABRIC_FIELDS),
    "storage": Record("storage", STORAGE_FIELDS),
    "steps": Record("steps", STEPS_FIELDS),
    "findings": ListOf(FINDING, MAX_FINDINGS),
}
SUBSCRIBE_FIELDS: tuple[Field, ...] = (
    Field("interval", Num(above=0, hi=3600), "s", "send samples at most this often "
          "(rounded to a multiple of the agent's interval); nil: every sample"),
    Field("families", ListOf(STR, 64), "names", "families to receive (`gpu`, "
          "`host`, `fabric`, `storage`, `steps`, `events`, `overview`, `findings`); nil: all"),
    Field("nodes", ListOf(Str(MAX_HOSTLIST_CHARS), MAX_ENTITIES), "host lists", "relays "
          "only (agents ignore "
          "it): nodes to receive, as host names or Slurm host lists (`gpu[001-064]`), "
          "matched against the source's target, its host and the node name in its hello; "
          "nil: all. At most 100,000 names and 4 MiB of names in all; a list that does not "
          "parse or names more closes the connection (1003) with the reason"),
    Field("detail", ListOf(STR, MAX_DETAIL), "sources", "relays only: sources (as the relay's "
          "batches name them) to send with every family whatever `families` says: the "
          "nodes the viewer looks at closely (its node screen)"),
    Field("overview_form", Int(1, 255), "", "the newest overview form the reader "
          "understands (\"Overview and findings\"): 2 for the compact form; nil or absent: "
          "1. A sender sends the newest form it has that is not newer"),
)
SUBSCRIBE = Record("subscribe", SUBSCRIBE_FIELDS)

# Every table above by the name docs/protocol.md gives it: the document lists each row
# (tests/test_docs.py), and the fuzz tests mutate each field (tests/test_schema_fuzz.py).
TABLES: dict[str, tuple[Field, ...]] = {
    "hello": HELLO_FIELDS,
    "hello.inventory": INVENTORY_FIELDS,
    "hello.host": HELLO_HOST_FIELDS,
    "inventory.gpus[]": GPU_INFO_FIELDS,
    "inventory.ports[]": PORT_INFO_FIELDS,
    "pcie_path[]": PCIE_HOP_FIELDS,
    "inventory.nics[]": NIC_INFO_FIELDS,
    "inventory.filesystems[]": FS_INFO_FIELDS,
    "inventory.disks[]": DISK_INFO_FIELDS,
    "sample.gpus[]": GPU_FIELDS,
    "process": PROCESS_FIELDS,
    "mig": MIG_FIELDS,
    "sample.host": HOST_FIELDS,
    "sample.fabric": FABRIC_FIELDS,
    "fabric.ports[]": PORT_FIELDS,
    "fabric.nics[]": NIC_FIELDS,
    "sample.storage": STORAGE_FIELDS,
    "storage.filesystems[]": FS_FIELDS,
    "storage.disks[]": DISK_FIELDS,
    "sample.steps": STEPS_FIELDS,
    "steps.jobs[]": STEP_JOB_FIELDS,
    "jobs[].ranks[]": STEP_RANK_FIELDS,
    "jobs[].windows[]": STEP_WINDOW_FIELDS,
    "jobs[].total": STEP_TOTAL_FIELDS,
    "jobs[].drop": STEP_DROP_FIELDS,
    "overview.fs_rows[]": FS_ROW_FIELDS,
    "sample.findings[]": FINDING_FIELDS,
    "event": EVENT_FIELDS,
    "subscribe": SUBSCRIBE_FIELDS,
    "batch.budget.<job>": BUDGET_FIELDS,
    "batch.judgement": JUDGEMENT_FIELDS,
    "judgement.findings[]": JUDGED_FINDING_FIELDS,
}
