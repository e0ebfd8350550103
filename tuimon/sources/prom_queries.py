"""The PromQL a Prometheus source runs, and how each result maps onto protocol fields.

A fixed set of instant queries per refresh, whatever the node count: each query selects
a family of series for every node at once (a `__name__` regex, or one `rate()` with the
agent's and node_exporter's names joined by `or`). Three vocabularies are understood:

- tuimon's own agent metrics (labels `node`, `gpu`, `uuid`, ...; docs/metrics.md);
- NVIDIA dcgm-exporter (`DCGM_FI_DEV_*`, labels `Hostname`, `gpu`, `UUID`, `modelName`);
- node_exporter (`node_infiniband_*`, `node_disk_*`, `node_mountstats_nfs_*`,
  `node_cpu_seconds_total`, `node_memory_*`; the node is the host part of `instance`).

`{m}` in a template is replaced by the site's extra label matchers (`--match`), so one
Prometheus can hold several clusters.
"""

from __future__ import annotations

from collections.abc import Callable

MIB = 1 << 20

# tuimon metric -> (wire key, scale)
TUIMON_GPU: dict[str, tuple[str, float]] = {
    "tuimon_gpu_utilization_ratio": ("util", 1.0),
    "tuimon_gpu_memory_utilization_ratio": ("mem_util", 1.0),
    "tuimon_gpu_memory_used_bytes": ("mem_used", 1.0),
    "tuimon_gpu_memory_total_bytes": ("mem_total", 1.0),
    "tuimon_gpu_temperature_celsius": ("temp", 1.0),
    "tuimon_gpu_power_watts": ("power", 1.0),
    "tuimon_gpu_power_limit_watts": ("power_limit", 1.0),
    "tuimon_gpu_sm_clock_hertz": ("sm_clock", 1.0),
    "tuimon_gpu_memory_clock_hertz": ("mem_clock", 1.0),
    "tuimon_gpu_performance_state": ("pstate", 1.0),
    "tuimon_gpu_ecc_corrected_errors_total": ("ecc_corrected", 1.0),
    "tuimon_gpu_ecc_uncorrected_errors_total": ("ecc_uncorrected", 1.0),
    "tuimon_gpu_remapped_rows": ("remapped_rows", 1.0),
    "tuimon_gpu_remapped_rows_pending": ("remap_pending", 1.0),
    "tuimon_gpu_remapped_rows_failed": ("remap_failed", 1.0),
    "tuimon_gpu_retired_pages": ("retired_pages", 1.0),
    "tuimon_gpu_pcie_transmit_bytes_per_second": ("pcie_tx", 1.0),
    "tuimon_gpu_pcie_receive_bytes_per_second": ("pcie_rx", 1.0),
    "tuimon_gpu_processes": ("procs", 1.0),
    "tuimon_gpu_process_memory_bytes": ("proc_mem", 1.0),
    "tuimon_gpu_xid_errors_total": ("xid_total", 1.0),
    "tuimon_gpu_last_xid": ("last_xid", 1.0),
    "tuimon_gpu_up": ("_up", 1.0),
    "tuimon_gpu_sm_clock_max_hertz": ("_max_sm_clock", 1.0),
}

# dcgm-exporter's default counters (dcp-metrics-included.csv / default-counters.csv).
DCGM_GPU: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util", 0.01),  # percent
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util", 0.01),
    "DCGM_FI_DEV_FB_USED": ("mem_used", MIB),  # MiB
    "DCGM_FI_DEV_FB_FREE": ("_fb_free", MIB),
    "DCGM_FI_DEV_GPU_TEMP": ("temp", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock", 1e6),  # MHz
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock", 1e6),
    "DCGM_FI_DEV_XID_ERRORS": ("last_xid", 1.0),  # the last XID's code, 0 for none
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_corrected", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_uncorrected", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remap_failed", 1.0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows", 1.0),
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": ("pcie_tx", 1024.0),  # KB/s
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": ("pcie_rx", 1024.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("_throttle_bits", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("_gr_active", 1.0),  # ratio, when DCP is on
}

TUIMON_HOST: dict[str, tuple[str, float]] = {
    "tuimon_host_cpu_utilization_ratio": ("cpu_util", 1.0),
    "tuimon_host_cpus": ("cpus", 1.0),
    "tuimon_host_load1": ("load1", 1.0),
    "tuimon_host_memory_total_bytes": ("mem_total", 1.0),
    "tuimon_host_memory_available_bytes": ("mem_available", 1.0),
    "tuimon_host_memory_used_bytes": ("mem_used", 1.0),
    "tuimon_host_uptime_seconds": ("uptime", 1.0),
    "node_memory_MemTotal_bytes": ("mem_total", 1.0),
    "node_memory_MemAvailable_bytes": ("mem_available", 1.0),
    "node_load1": ("load1", 1.0),
}

PORT_GAUGES: dict[str, str] = {
    "tuimon_ib_port_rate_bytes_per_second": "rate",
    "tuimon_ib_port_state_id": "state",
    "tuimon_ib_port_physical_state_id": "phys_state",
    "node_infiniband_rate_bytes_per_second": "rate",
    "node_infiniband_state_id": "state",
    "node_infiniband_physical_state_id": "phys_state",
}

# dcgm-exporter's clock throttle bit mask, as NVML names the bits.
THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                 0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown"}

IB_ERRORS_TUIMON = ("symbol_errors|link_downed|receive_errors|link_error_recovery|"
                    "receive_remote_physical_errors|transmit_discards|"
                    "excessive_buffer_overrun_errors|local_link_integrity_errors")
IB_ERRORS_NODE = ("symbol_error|link_downed|port_errors_received|link_error_recovery|"
                  "port_receive_remote_physical_errors|port_discards_transmitted|"
                  "excessive_buffer_overrun_errors|local_link_integrity_errors")


def _names(table: dict[str, object]) -> str:
    return "|".join(table)


def _either(tuimon: str, node: str, how: str = "rate({sel}[1m])") -> str:
    return f"{how.format(sel=tuimon)} or {how.format(sel=node)}"


def _moved(by: str, selector: str) -> str:
    now = f"sum by ({by}) ({selector})"
    before = f"sum by ({by}) ({selector} offset 1m)"
    return f"clamp_min({now} - {before}, 0)"


# name -> PromQL template. Every refresh runs all of them, concurrently (a few at once).
LIVE_QUERIES: dict[str, str] = {
    "gpu": '{{__name__=~"' + _names(TUIMON_GPU) + '"{m}}}',
    "clock_events": "tuimon_gpu_clock_event_active{{{mm}}} == 1",
    "dcgm": '{{__name__=~"' + _names(DCGM_GPU) + '"{m}}}',
    "host": '{{__name__=~"' + _names(TUIMON_HOST) + '"{m}}}',
    "host_cpu": '1 - avg by (instance) (rate(node_cpu_seconds_total{{mode="idle"{m}}}[1m]))',
    "port_gauges": '{{__name__=~"' + _names(PORT_GAUGES) + '"{m}}}',
    "ib_tx": _either("tuimon_ib_port_transmit_bytes_total{{{mm}}}",
                     "node_infiniband_port_data_transmitted_bytes_total{{{mm}}}"),
    "ib_rx": _either("tuimon_ib_port_receive_bytes_total{{{mm}}}",
                     "node_infiniband_port_data_received_bytes_total{{{mm}}}"),
    "ib_wait": _either("tuimon_ib_port_transmit_wait_total{{{mm}}}",
                       "node_infiniband_port_transmit_wait_total{{{mm}}}"),
    # Error counters that moved in the last minute, all kinds summed per port. Not
    # increase() over a name regex: that would drop the names and collide.
    "ib_errors": (
        _moved("node, instance, device, port",
               '{{__name__=~"tuimon_ib_port_(' + IB_ERRORS_TUIMON + ')_total"{m}}}')
        + " or " + _moved("instance, device, port",
                          '{{__name__=~"node_infiniband_(' + IB_ERRORS_NODE + ')_total"{m}}}')),
    "fs_read": _either("tuimon_fs_read_bytes_total{{{mm}}}",
                       "node_mountstats_nfs_read_bytes_total{{{mm}}}"),
    "fs_write": _either("tuimon_fs_write_bytes_total{{{mm}}}",
                        "node_mountstats_nfs_write_bytes_total{{{mm}}}"),
    "disk_read": _either("tuimon_disk_read_bytes_total{{{mm}}}",
                         "node_disk_read_bytes_total{{{mm}}}"),
    "disk_write": _either("tuimon_disk_written_bytes_total{{{mm}}}",
                          "node_disk_written_bytes_total{{{mm}}}"),
    "job_wall": "rate(tuimon_job_wall_seconds_total{{{mm}}}[1m])",
    "job_compute": "rate(tuimon_job_compute_seconds_total{{{mm}}}[1m])",
    "job_samples": "rate(tuimon_job_samples_total{{{mm}}}[1m])",
    "job_steps": "rate(tuimon_job_steps_total{{{mm}}}[1m])",
}

# The error budget from the job counters: one query for the SLO window, one per burn
# window; run every `budget_every` seconds (they read a lot of data).
JOB_BY = "exported_job, job"


def budget_queries(window_hours: float) -> dict[str, str]:
    wall = "sum by (" + JOB_BY + ") (increase(tuimon_job_wall_seconds_total{{{mm}}}[{w}]))"
    compute = ("sum by (" + JOB_BY + ") (increase(tuimon_job_compute_seconds_total{{{mm}}}"
               "[{w}]))")
    ranks = "count by (" + JOB_BY + ") (tuimon_job_wall_seconds_total{{{mm}}})"
    out = {
        # run time and effective time, in hours of the job (rank-seconds / ranks)
        "budget_total": f"{wall} / {ranks} / 3600".replace("{w}", f"{int(window_hours)}h"),
        "budget_effective": f"{compute} / {ranks} / 3600".replace(
            "{w}", f"{int(window_hours)}h"),
    }
    for w in ("5m", "30m", "1h", "6h", "1d", "3d"):
        out[f"ratio_{w}"] = f"1 - {compute} / {wall}".replace("{w}", w)
    return out


def render(template: str, match: str) -> str:
    """Fill a template with the extra matchers: `{m}` after other matchers, `{mm}` alone."""
    return template.format(m=f",{match}" if match else "", mm=match)


Mapper = Callable[[dict[str, str]], str | None]


def node_of(labels: dict[str, str]) -> str | None:
    """Which node a series belongs to: tuimon's `node`, DCGM's `Hostname`, else the host
    part of node_exporter's `instance`."""
    for key in ("node", "Hostname", "hostname", "nodename"):
        if labels.get(key):
            return labels[key]
    instance = labels.get("instance")
    if not instance:
        return None
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    return instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance
