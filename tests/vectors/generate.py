"""Write the golden vectors of protocol v1. Run once; the files are then fixed.

    python tests/vectors/generate.py

Each valid vector is NAME.msgpack (the exact bytes) beside NAME.json (the same map as
JSON; a msgpack bin is {"$bin": "<hex>"} there). Each invalid one is
invalid/NAME.msgpack with the decoder's expected reason in invalid/reasons.json. An
agent in another language passes when it decodes the valid vectors to the JSON maps and
rejects the invalid ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgpack

HERE = Path(__file__).parent

GPU = {
    "util": 0.93, "mem_util": 0.55, "mem_used": 73902323712, "mem_total": 85899345920,
    "temp": 68.0, "power": 640.5, "power_limit": 700.0, "energy": 1234567.25,
    "sm_clock": 1980000000.0, "mem_clock": 2619000000.0, "clock_events": [],
    "pstate": 0, "ecc_corrected": 2, "ecc_uncorrected": 0, "retired_pages": None,
    "retired_pending": None, "remapped_rows": 0, "remap_pending": 0, "remap_failed": 0,
    "pcie_tx": 1.5e9, "pcie_rx": 6.25e9, "nvlink_tx": 2.5e11, "nvlink_rx": 2.5e11,
    "nvlink_tx_total": 900000000000, "nvlink_rx_total": 900000000000,
    "procs": 1, "proc_mem": 71000000000, "xid_total": 0, "last_xid": None,
}

# A GPU's own link (from its switch's downstream port) and the switch's uplink.
PCIE_HOP = {"up": "0000:17:01.0", "down": "0000:19:00.0", "up_kind": "switch",
            "up_gen_max": 5, "up_width_max": 16, "down_gen_max": 5, "down_width_max": 16}
PCIE_UPLINK = {"up": "0000:15:01.0", "down": "0000:16:00.0", "up_kind": "root",
               "up_gen_max": 5, "up_width_max": 16, "down_gen_max": 5, "down_width_max": 16}

# The findings both overview vectors carry.
OVERVIEW_FINDINGS = [
    {"severity": "warning", "kind": "thermal",
     "message": "gpu003 GPU 1 thermal throttling at 88 °C", "gpu": 1, "score": 0.4},
    {"severity": "critical", "kind": "gpu_failed",
     "message": "gpu003 GPU 2 failed: GPU is lost", "gpu": 2, "score": 0.6},
    {"severity": "critical", "kind": "link_down",
     "message": "gpu003 mlx5_1:1 link DOWN", "port": "mlx5_1:1", "score": 0.8},
]

VALID = {
    "hello": {
        "v": 1, "t": "hello", "node": "gpu001", "agent_version": "0.1.0",
        "boot_id": "0b6f2bd6-6d3c-4b34-9c5a-1f0c6d1f6a11", "interval": 1.0,
        "ts": 1796000000.5, "families": ["gpu", "host", "events"],
        "inventory": {
            "gpus": [{"index": 0, "uuid": "GPU-5f2a1c3e-0000-4000-8000-000000000000",
                      "name": "NVIDIA H100 80GB HBM3", "mem_total": 85899345920,
                      "power_limit": 700.0, "pci_bus_id": "00000000:18:00.0",
                      "max_sm_clock": 1980000000.0, "max_mem_clock": 2619000000.0}],
            "driver_version": "550.90.07", "gpu_status": None,
        },
        "host": {"hostname": "gpu001"},
    },
    "hello_no_driver": {
        "v": 1, "t": "hello", "node": "login01", "agent_version": "0.1.0", "boot_id": None,
        "interval": 1.0, "ts": 1796000000.0, "families": ["gpu", "host", "events"],
        "inventory": {"gpus": [], "driver_version": None,
                      "gpu_status": "no NVIDIA driver or GPU: NVML init failed "
                                    "(NVML Shared Library Not Found)"},
        "host": {"hostname": "login01"},
    },
    "sample": {
        "v": 1, "t": "sample", "seq": 42, "ts": 1796000041.5, "interval": 1.0,
        "gpus": [GPU, {"failed": "GPU is lost", "xid_total": 1, "last_xid": 79}],
        "host": {"cpu_util": 0.21, "cpus": 128, "load1": 22.5, "load5": 21.0,
                 "load15": 20.0, "mem_total": 2199023255552, "mem_available": 1209956446208,
                 "mem_used": 989066809344, "uptime": 1140041.75},
        "dropped": 3,
    },
    "sample_unreadable_fields": {
        "v": 1, "t": "sample", "seq": 7, "ts": 1796000007.0, "interval": 1.0,
        "gpus": [{"util": None, "temp": 41.0, "power": None,
                  "errors": {"power": "Insufficient Permissions"}}],
        "host": {"cpu_util": None, "errors": {"cpu_util": "proc/stat: permission denied"}},
    },
    "event_xid": {
        "v": 1, "t": "event", "ts": 1796000050.25, "kind": "xid", "severity": "critical",
        "message": "XID 79 on GPU 3: GPU has fallen off the bus", "gpu": 3, "code": 79,
        "source": "gpu",
    },
    "event_collector_failed": {
        "v": 1, "t": "event", "ts": 1796000051.0, "kind": "collector_failed",
        "severity": "warning", "message": "host collector failed: proc/stat: missing",
        "gpu": None, "code": None, "source": "host",
    },
    "subscribe": {"v": 1, "t": "subscribe", "interval": 5.0, "families": ["gpu", "events"]},
    "hello_fabric_storage": {
        "v": 1, "t": "hello", "node": "gpu002", "agent_version": "0.1.0", "boot_id": None,
        "interval": 1.0, "ts": 1796000000.0,
        "families": ["gpu", "host", "fabric", "storage", "events"],
        "inventory": {
            "gpus": [], "driver_version": None, "gpu_status": "no NVIDIA driver or GPU",
            "ports": [{"id": "mlx5_0:1", "device": "mlx5_0", "port": 1, "netdev": None,
                       "link_layer": "InfiniBand", "rate": 50000000000.0,
                       "rate_text": "400 Gb/sec (4X NDR)", "hca_type": "MT4129",
                       "board_id": "MT_0000000838", "fw_ver": "28.39.1002"}],
            "nics": [{"id": "eth0", "speed": 3125000000.0}],
            "filesystems": [{"id": "/lustre/scratch", "fstype": "lustre",
                             "source": "10.0.0.1@o2ib:/scratch"}],
            "disks": [{"id": "nvme0n1", "kind": "disk"}],
            "fabric_status": None,
        },
        "host": {"hostname": "gpu002"},
    },
    "sample_fabric_storage": {
        "v": 1, "t": "sample", "seq": 9, "ts": 1796000009.0, "interval": 1.0, "gpus": [],
        "fabric": {
            "ports": [{"id": "mlx5_0:1", "state": 4, "state_name": "ACTIVE", "phys_state": 5,
                       "phys_state_name": "LinkUp", "tx_bytes_s": 2.5e10, "rx_bytes_s": 2.4e10,
                       "tx_packets_s": 6.1e6, "rx_packets_s": 5.9e6, "xmit_wait_s": 1500.0,
                       "tx_util": 0.5, "rx_util": 0.48,
                       "errors_inc": {"symbol_errors": 3, "link_downed": None},
                       "saturated": ["link_downed"],
                       "hw": {"np_cnp_sent": 50.0, "rp_cnp_handled": 48.0}}],
            "nics": [{"id": "eth0", "operstate": "up", "rx_bytes_s": 2.0e6, "tx_bytes_s": 1.0e6,
                      "rx_util": 0.0006, "tx_util": 0.0003}],
        },
        "storage": {
            "filesystems": [{"id": "/lustre/scratch", "fstype": "lustre",
                             "source": "10.0.0.1@o2ib:/scratch", "read_bytes_s": 1.5e9,
                             "write_bytes_s": 0.0, "read_ops_s": 360.0, "write_ops_s": 0.0,
                             "metadata_ops_s": 280.0, "size": 20000000000000000,
                             "free": 7800000000000000, "avail": 7800000000000000,
                             "inodes": 19073486328, "inodes_free": 13351440429}],
            "disks": [{"id": "nvme0n1", "kind": "disk", "read_bytes_s": 2.2e8,
                       "write_bytes_s": 6.4e6, "read_iops": 1750.0, "write_iops": 88.0,
                       "await": 0.00008, "busy": 0.126}],
        },
    },
    # What a viewer of the whole cluster takes from each node (families overview,
    # findings, steps, events): levels, percents, port waits, shared file systems, and
    # the conditions the node's own rules found.
    "sample_overview": {
        "v": 1, "t": "sample", "seq": 120, "ts": 1796000120.0, "interval": 1.0,
        # Levels are bytes of level + 2 (0 no data, 1 failed, 2..10 the nine steps), in a
        # blob a section: the number of metrics, then each metric's cells in the protocol's
        # order (GPU: util mem temp power clock health; fabric: util congestion errors).
        # Busy is a byte per GPU, a percent or 255 (unknown). `ports` may be left out when
        # they are the hello's; a file system is a row of FS_COLUMNS.
        "overview": {
            "gpu_levels": bytes([6, 10, 9, 1, 9, 9, 1, 6, 8, 1, 9, 8, 1, 10, 7, 1, 2, 6, 1]),
            "busy": bytes([97, 88, 255]),
            "ports": ["mlx5_0:1", "mlx5_1:1"],
            "fabric_levels": bytes([3, 6, 6, 5, 0, 2, 10]),
            "wait": [1500, None],
            "fs_rows": [["/lustre/scratch", "lustre", 1500000000, 0, 280.0,
                         20000000000000000, 7800000000000000]],
        },
        "findings": OVERVIEW_FINDINGS,
    },
    # The same overview in its first form (agents of late 2026: levels as maps of metric
    # to bytes, file systems as maps). Viewers still read it, as the compact form above.
    "sample_overview_first_form": {
        "v": 1, "t": "sample", "seq": 120, "ts": 1796000120.0, "interval": 1.0,
        # Levels are bytes of level + 2 (0 no data, 1 failed, 2..10 the nine steps);
        # busy is a byte per GPU, a percent or 255 (unknown).
        "overview": {
            "gpu": {"util": bytes([10, 9, 1]), "mem": bytes([9, 9, 1]),
                    "temp": bytes([6, 8, 1]), "power": bytes([9, 8, 1]),
                    "clock": bytes([10, 7, 1]), "health": bytes([2, 6, 1])},
            "busy": bytes([97, 88, 255]),
            "ports": ["mlx5_0:1", "mlx5_1:1"],
            "fabric": {"util": bytes([6, 6]), "congestion": bytes([5, 0]),
                       "errors": bytes([2, 10])},
            "wait": [1500, None],
            "fs": [{"id": "/lustre/scratch", "fstype": "lustre", "read": 1500000000,
                    "write": 0, "md_ops": 280.0, "size": 20000000000000000,
                    "free": 7800000000000000}],
        },
        "findings": OVERVIEW_FINDINGS,
    },
    "subscribe_overview_detail": {
        "v": 1, "t": "subscribe", "interval": None,
        "families": ["events", "findings", "overview", "steps"],
        "detail": ["gpu003:9477"], "overview_form": 2,
    },
    # A job's step sums on one node: per rank, the waiting split by what was waited on
    # (kinds a reader does not know count as `other`), the last minute and hour, and the
    # totals since the agent began counting the job.
    "sample_steps": {
        "v": 1, "t": "sample", "seq": 300, "ts": 1796000300.0, "interval": 1.0,
        "steps": {
            "jobs": [{
                "id": "llm-pretrain", "world": 16,
                "ranks": [{"rank": 0, "steps": 2, "wall": 1.0, "compute": 0.7,
                           "samples": 64, "tokens": 131072,
                           "waits": {"comm": 0.2, "data": 0.05, "other": 0.05}},
                          {"rank": 1, "steps": 2, "wall": 1.0, "compute": 0.9,
                           "samples": 64, "tokens": 131072,
                           "waits": {"comm": 0.08, "pipeline_bubble": 0.02}}],
                "windows": [{"s": 60.0, "covered": 60.0, "wall": 120.0, "compute": 96.0,
                             "samples": 7680, "waits": {"comm": 18.0, "data": 6.0}},
                            {"s": 3600.0, "covered": 1800.0, "wall": 3600.0,
                             "compute": 3240.0, "samples": 230400,
                             "waits": {"comm": 250.0, "checkpoint": 110.0}}],
                "total": {"steps": 3600, "wall": 3600.0, "compute": 3240.0,
                          "samples": 230400, "since": 1795998500.0,
                          "waits": {"comm": 250.0, "checkpoint": 110.0}},
            }],
            "received": 7200, "rejected": 0, "lost": 0, "clipped": 0,
        },
    },
    # A relay's batch with its judgement (since 2026-12): a leaf's congestion, with the
    # nodes it names as a host list, and a straggler with its cause, each with the true
    # onset and how long it had held when the relay judged.
    "batch_judgement": {
        "v": 1, "t": "batch", "ts": 1796003000.5, "relay": "login1",
        "frames": [], "sources": [["gpu042:9477", "up", None]],
        "judgement": {
            "at": 1796003000.0,
            "findings": [
                {"severity": "warning", "kind": "congestion",
                 "message": "congestion concentrated under leaf01: xmit_wait 3,981,200/s vs "
                            "1,150/s elsewhere (16 nodes)",
                 "score": 1.0, "leaf": "leaf01", "nodes": "gpu[001-016]",
                 "since": 1796000180.0, "held": 2820.0},
                {"severity": "warning", "kind": "straggler",
                 "message": "gpu042 GPU 3 (rank 331 of llm-pretrain) computes x1.15 the "
                            "median of its peers; likely: thermal (GPU 3 thermal throttling "
                            "at 93 °C)",
                 "gpu": 3, "score": 0.7, "node": "gpu042", "job": "llm-pretrain",
                 "since": 1796002100.0, "held": 900.0},
            ],
        },
    },
    # A GPU and an HCA of a real HGX H100 with their PCIe paths (since 2026-12): each
    # behind a Broadcom PEX890xx switch downstream port, the switch behind a root port
    # (leptonai/gpud pkg/pci/testdata/lspci-vvv; tests/fixtures/real/README.md).
    "hello_pcie_path": {
        "v": 1, "t": "hello", "node": "gpu003", "agent_version": "0.1.0", "boot_id": None,
        "interval": 1.0, "ts": 1796000000.0, "families": ["gpu", "host", "fabric", "events"],
        "inventory": {
            "gpus": [{"index": 0, "uuid": None, "name": "NVIDIA H100 80GB HBM3",
                      "mem_total": None, "power_limit": None, "pci_bus_id": "00000000:19:00.0",
                      "max_sm_clock": None, "max_mem_clock": None, "pcie_gen_max": 5,
                      "pcie_width_max": 16,
                      "pcie_path": [PCIE_HOP, PCIE_UPLINK]}],
            "driver_version": "550.90.07", "gpu_status": None,
            "ports": [{"id": "mlx5_0:1", "device": "mlx5_0", "port": 1, "hca_type": "MT4129",
                       "pcie_gen": 5, "pcie_width": 16, "pcie_gen_max": 5,
                       "pcie_width_max": 16,
                       "pcie_path": [{**PCIE_HOP, "up": "0000:17:02.0", "down": "0000:1a:00.0",
                                      "gen": 5, "width": 16},
                                     {**PCIE_UPLINK, "gen": 5, "width": 16}]}],
        },
        "host": {"hostname": "gpu003"},
    },
    # Each link of the GPU's path now, one not read.
    "sample_pcie_path": {
        "v": 1, "t": "sample", "seq": 3, "ts": 1796000003.0, "interval": 1.0,
        "gpus": [{"util": 0.97, "pcie_gen": 5, "pcie_width": 16, "pcie_path_gen": [5, None],
                  "pcie_path_width": [16, None]}],
    },
    "future_type_ignored": {"v": 1, "t": "relay_batch_v9", "payload": [1, 2, 3]},
    "future_fields_ignored": {
        "v": 1, "t": "sample", "seq": 1, "ts": 1796000000.0, "interval": 1.0,
        "gpus": [{"util": 0.5, "tensor_core_util": 0.4}], "host": {}, "fabric": {"ports": []},
    },
}

INVALID = {
    "not_a_map": ([1, 2, 3], "message must be a map"),
    "no_version": ({"t": "sample"}, "protocol version"),
    "no_type": ({"v": 1}, "message type"),
    "sample_bad_seq": ({"v": 1, "t": "sample", "seq": -1, "ts": 1.0, "interval": 1.0},
                       "sample.seq"),
    "sample_string_temp": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                            "gpus": [{"temp": "hot"}]}, "sample.gpus[0].temp"),
    "sample_zero_interval": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 0},
                             "sample.interval"),
    "hello_no_node": ({"v": 1, "t": "hello", "agent_version": "x", "interval": 1.0,
                       "ts": 1.0}, "hello.node"),
    "event_bad_gpu": ({"v": 1, "t": "event", "ts": 1.0, "kind": "xid", "severity": "warning",
                       "gpu": "three"}, "event.gpu"),
    "subscribe_bad_interval": ({"v": 1, "t": "subscribe", "interval": -5}, "subscribe.interval"),
    "fabric_port_without_id": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                                "fabric": {"ports": [{"tx_bytes_s": 1.0}]}},
                               "sample.fabric.ports[0]"),
    "storage_not_a_map": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                           "storage": [1, 2]}, "sample.storage"),
    "overview_blob_uneven": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                              "overview": {"gpu_levels": bytes([6, 2, 2, 2])}},
                             "sample.overview.gpu_levels"),
    "overview_row_short": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                            "overview": {"fs_rows": [["/home", "nfs4", 5]]}},
                           "sample.overview.fs_rows[0]"),
    "overview_level_out_of_range": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0,
                                     "interval": 1.0,
                                     "overview": {"gpu": {"util": bytes([11])}}},
                                    "sample.overview.gpu"),
    "overview_levels_not_bytes": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0,
                                   "interval": 1.0, "overview": {"gpu": {"util": [4, 5]}}},
                                  "sample.overview.gpu"),
    "overview_busy_over_100": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                                "overview": {"busy": bytes([101])}}, "sample.overview.busy"),
    "overview_negative_wait": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                                "overview": {"wait": [-1]}}, "sample.overview.wait"),
    "findings_bad_severity": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                               "findings": [{"severity": "fatal", "kind": "xid",
                                             "message": "x"}]}, "sample.findings[0].severity"),
    "findings_gpu_out_of_range": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0,
                                   "interval": 1.0,
                                   "findings": [{"severity": "warning", "kind": "xid",
                                                 "message": "x", "gpu": 64}]},
                                  "sample.findings[0].gpu"),
    "subscribe_detail_not_a_list": ({"v": 1, "t": "subscribe", "detail": "gpu003"},
                                    "subscribe.detail"),
    "steps_negative_wait": ({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                             "steps": {"jobs": [{"id": "j", "world": 1,
                                                 "ranks": [{"rank": 0, "wall": 1.0,
                                                            "waits": {"comm": -0.5}}]}]}},
                            "sample.steps.jobs[0].ranks[0].waits"),
    "pcie_path_unknown_kind": ({"v": 1, "t": "hello", "node": "n", "agent_version": "x",
                                "interval": 1.0, "ts": 1.0,
                                "inventory": {"gpus": [{"index": 0, "pcie_path": [
                                    {"up": "0000:17:01.0", "up_kind": "bus"}]}]}},
                               "hello.inventory.gpus[0].pcie_path[0].up_kind"),
    "subscribe_overview_form_not_a_number": ({"v": 1, "t": "subscribe",
                                              "overview_form": "2"},
                                             "subscribe.overview_form"),
}


def as_json(value: object) -> object:
    """A msgpack bin in the JSON twin of a vector."""
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    raise TypeError(f"{type(value).__name__} in a vector")


def main() -> None:
    for name, wire in VALID.items():
        (HERE / f"{name}.msgpack").write_bytes(msgpack.packb(wire, use_bin_type=True))
        (HERE / f"{name}.json").write_text(json.dumps(wire, indent=2, default=as_json) + "\n")
    invalid = HERE / "invalid"
    invalid.mkdir(exist_ok=True)
    reasons = {}
    for name, (wire, reason) in INVALID.items():
        (invalid / f"{name}.msgpack").write_bytes(msgpack.packb(wire, use_bin_type=True))
        reasons[name] = reason
    (invalid / "truncated.msgpack").write_bytes(
        msgpack.packb(VALID["sample"], use_bin_type=True)[:40])
    reasons["truncated"] = "not a valid msgpack message"
    (invalid / "reasons.json").write_text(json.dumps(reasons, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
