"""Typed rows of the wire, one TypedDict per kind of row, written from the name
table (tuimon_core/protocol/fields.py) by tuimon_core/protocol/rows_gen.py: do
not edit. For the type checker only: at run time a row is the dict the decoder
made, so a misspelt key is caught by mypy at no cost. Every key may be absent,
and any but a required one nil (could not be read)."""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = [
    "DiskRow",
    "FsRow",
    "GpuInfoRow",
    "GpuRow",
    "HostRow",
    "MigRow",
    "NicRow",
    "PcieHopRow",
    "PortInfoRow",
    "PortRow",
    "ProcessRow",
]


# One GPU of a sample (`gpus`).
class GpuRow(TypedDict, total=False):
    util: float | None
    mem_util: float | None
    gr_active: float | None
    sm_active: float | None
    tensor_active: float | None
    dram_active: float | None
    mem_used: int | None
    mem_total: int | None
    mem_reserved: int | None
    temp: float | None
    power: float | None
    power_limit: float | None
    energy: float | None
    sm_clock: float | None
    mem_clock: float | None
    clock_events: list[str] | None
    pstate: int | None
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    retired_pages: int | None
    retired_pending: int | None
    remapped_rows: int | None
    remap_pending: int | None
    remap_failed: int | None
    pcie_tx: float | None
    pcie_rx: float | None
    pcie_gen: int | None
    pcie_width: int | None
    pcie_replays: int | None
    pcie_path_gen: list[int] | None
    pcie_path_width: list[int] | None
    nvlink_replay_errors: int | None
    nvlink_recovery_errors: int | None
    nvlink_crc_errors: int | None
    nvlink_tx: float | None
    nvlink_rx: float | None
    nvlink_tx_total: int | None
    nvlink_rx_total: int | None
    procs: int | None
    proc_mem: int | None
    xid_total: int | None
    last_xid: int | None
    processes: list[ProcessRow] | None
    mig_mode: int | None
    mig: list[MigRow] | None
    failed: str | None
    errors: dict[str, Any] | None


# One MIG instance of a GPU (`mig`).
class MigRow(TypedDict, total=False):
    gi: int
    ci: int | None
    profile: str | None
    uuid: str | None
    mem_used: int | None
    mem_total: int | None
    procs: int | None
    proc_mem: int | None
    processes: list[ProcessRow] | None
    gr_active: float | None
    sm_active: float | None
    tensor_active: float | None
    dram_active: float | None
    errors: dict[str, Any] | None


# A sample's `host`.
class HostRow(TypedDict, total=False):
    cpu_util: float | None
    cpus: int | None
    load1: float | None
    load5: float | None
    load15: float | None
    mem_total: int | None
    mem_available: int | None
    mem_used: int | None
    uptime: float | None
    errors: dict[str, Any] | None


# One fabric port of a sample (`fabric.ports`).
class PortRow(TypedDict, total=False):
    id: str
    state: int | None
    state_name: str | None
    phys_state: int | None
    phys_state_name: str | None
    tx_bytes_s: float | None
    rx_bytes_s: float | None
    tx_packets_s: float | None
    rx_packets_s: float | None
    xmit_wait_s: float | None
    tx_util: float | None
    rx_util: float | None
    errors_inc: dict[str, Any] | None
    saturated: list[str] | None
    hw: dict[str, Any] | None
    counter_errors: dict[str, Any] | None
    pause_rx_s: float | None
    pause_tx_s: float | None
    paused_rx: float | None
    paused_tx: float | None
    pause_storms: int | None
    admin_up: int | None
    pause_by: str | None
    pfc: list[int] | None
    discards_s: float | None
    arrived_s: float | None
    lossless_discards_s: float | None
    lossless_arrived_s: float | None


# One NIC of a sample (`fabric.nics`).
class NicRow(TypedDict, total=False):
    id: str
    operstate: str | None
    rx_bytes_s: float | None
    tx_bytes_s: float | None
    rx_packets_s: float | None
    tx_packets_s: float | None
    rx_errors_s: float | None
    tx_errors_s: float | None
    rx_dropped_s: float | None
    tx_dropped_s: float | None
    rx_util: float | None
    tx_util: float | None
    counter_errors: dict[str, Any] | None


# One file system of a sample (`storage.filesystems`).
class FsRow(TypedDict, total=False):
    id: str
    fstype: str
    source: str | None
    mounts: list[str] | None
    instances: int | None
    read_bytes_s: float | None
    write_bytes_s: float | None
    read_ops_s: float | None
    write_ops_s: float | None
    metadata_ops_s: float | None
    latency: dict[str, Any] | None
    size: int | None
    free: int | None
    avail: int | None
    inodes: int | None
    inodes_free: int | None
    error: str | None
    capacity_error: str | None


# One disk of a sample (`storage.disks`).
DiskRow = TypedDict("DiskRow", {  # a keyword key: the functional form
    "id": str,
    "kind": str | None,
    "read_bytes_s": float | None,
    "write_bytes_s": float | None,
    "read_iops": float | None,
    "write_iops": float | None,
    "await": float | None,
    "busy": float | None,
}, total=False)


# One GPU of a hello (`gpus`).
class GpuInfoRow(TypedDict, total=False):
    index: int
    uuid: str | None
    name: str | None
    mem_total: int | None
    power_limit: float | None
    pci_bus_id: str | None
    max_sm_clock: float | None
    max_mem_clock: float | None
    vbios: str | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    nvlinks: int | None
    nvlinks_total: int | None
    pcie_path: list[PcieHopRow] | None


# One port of a hello (`ports`).
class PortInfoRow(TypedDict, total=False):
    id: str
    device: str | None
    port: int | str | None
    link_layer: str | None
    rate: float | None
    rate_text: str | None
    hca_type: str | None
    board_id: str | None
    fw_ver: str | None
    netdev: str | None
    up: int | None
    pcie_gen: int | None
    pcie_width: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    pcie_path: list[PcieHopRow] | None


# One process on a GPU or MIG instance (`processes`).
class ProcessRow(TypedDict, total=False):
    pid: int
    mem: int | None
    user: str | None
    command: str | None
    job: str | None
    pod_uid: str | None
    namespace: str | None
    pod: str | None
    container: str | None
    runtime: str | None


# One link of a PCIe path (`pcie_path`).
class PcieHopRow(TypedDict, total=False):
    up: str | None
    down: str | None
    up_kind: str | None
    up_gen_max: int | None
    up_width_max: int | None
    down_gen_max: int | None
    down_width_max: int | None
    gen: int | None
    width: int | None
