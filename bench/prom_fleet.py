"""A fleet of GPU nodes as a Prometheus server sees them: for each node, dcgm-exporter
3.x's series (the fields and labels of a real A800 scrape, tests/fixtures/real/
dcgm_v3_a800_mig_2g20gb.prom: 15 fields x 8 GPUs) and node_exporter's InfiniBand
collector (8 ports, its 23 series each) with `node_uname_info`: about 300 series a
node, as the issue measured. One HTTP server answers for every node, laid out as
`--layout` says (`scrape_configs`):

  - instance (the default): each node its own target (`/metrics/<node>`), Prometheus
    relabelling `instance` to the node's own host and port;
  - labels (Kubernetes-style): one target for every node (`/metrics/all`, `instance`
    the same on every series), each series naming its node by a label: dcgm-exporter's
    `Hostname`, node_exporter's a `node` label (as a relabelled
    `__meta_kubernetes_pod_node_name` gives);
  - mixed: as instance, but every fourth node has dcgm-exporter's series only and the
    next node_exporter's only.

Each target's text is laid out once; a scrape fills in only the counters (which grow
with time, so rates are real) and the gauges that move on a real GPU (how busy it is,
its clocks, power and temperature: a new value at each 5 s scrape, from a few laid out
in advance), so a 2-core machine can serve thousands, and Prometheus stores, and the
app reads and draws, values that change as a busy fleet's do.

    .venv/bin/python bench/prom_fleet.py NODES --port P --ready FILE [--layout labels]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from pathlib import Path

DCGM_GAUGES = (  # (name, help, value for GPU i of node n)
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda n, i: 1410 + (n + i) % 7),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda n, i: 55 + (n * 7 + i) % 25),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda n, i: 250.5 + (n + 3 * i) % 150),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda n, i: 60 + (n + i) % 40),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda n, i: 20 + i),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda n, i: 21000 + n % 9),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda n, i: 60000 - n % 9),
    ("DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION", "vGPUs per-process utilization.",
     lambda n, i: 0),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
     lambda n, i: 79 if (n, i) == (7, 3) else 0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.",
     lambda n, i: 0.85),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipe is active.",
     lambda n, i: 0.41),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active.",
     lambda n, i: 0.33),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus.",
     lambda n, i: 1.2e9),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus.",
     lambda n, i: 0.9e9),
)
# The gauges that move with the work, by how far (the value of DCGM_GAUGES times
# 1 +- this, in PHASES steps): each GPU's own phase, so no two neighbours move alike.
MOVING = {"DCGM_FI_DEV_SM_CLOCK": 0.02, "DCGM_FI_DEV_GPU_TEMP": 0.04,
          "DCGM_FI_DEV_POWER_USAGE": 0.10, "DCGM_FI_DEV_GPU_UTIL": 0.15,
          "DCGM_FI_DEV_MEM_COPY_UTIL": 0.30, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.15,
          "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.30, "DCGM_FI_PROF_DRAM_ACTIVE": 0.30,
          "DCGM_FI_PROF_PCIE_TX_BYTES": 0.40, "DCGM_FI_PROF_PCIE_RX_BYTES": 0.40}
PHASES = 12
SCRAPE_S = 5.0  # a new phase every scrape of the benches' Prometheus


def phases(name: str, value: float, spread: float, n: int, i: int) -> list[str]:
    """A moving gauge's values, one a phase, as the exposition writes them (a share of
    time at most 1, a percentage at most 100)."""
    cap = 1.0 if name.endswith("_ACTIVE") else 100.0 if name.endswith("_UTIL") else math.inf
    out = []
    for k in range(PHASES):
        v = min(cap, value * (1 + spread * math.sin(2 * math.pi * (k + 5 * n + 3 * i)
                                                     / PHASES)))
        out.append(f"{v:.4g}" if isinstance(value, float) else str(round(v)))
    return out


DCGM_COUNTERS = (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                  "Total energy consumption since boot (in mJ).", 300_000.0),)
# node_exporter's infiniband collector, per port: (name, kind, growth per second)
IB = (
    ("excessive_buffer_overrun_errors_total", "counter", 0.0),
    ("link_downed_total", "counter", 0.0), ("link_error_recovery_total", "counter", 0.0),
    ("local_link_integrity_errors_total", "counter", 0.0),
    ("multicast_packets_received_total", "counter", 10.0),
    ("multicast_packets_transmitted_total", "counter", 10.0),
    ("port_constraint_errors_received_total", "counter", 0.0),
    ("port_constraint_errors_transmitted_total", "counter", 0.0),
    ("port_data_received_bytes_total", "counter", 9.1e9),
    ("port_data_transmitted_bytes_total", "counter", 9.4e9),
    ("port_discards_received_total", "counter", 0.0),
    ("port_discards_transmitted_total", "counter", 0.0),
    ("port_errors_received_total", "counter", 0.0),
    ("port_packets_received_total", "counter", 2.2e6),
    ("port_packets_transmitted_total", "counter", 2.3e6),
    ("port_receive_remote_physical_errors_total", "counter", 0.0),
    ("port_transmit_wait_total", "counter", 5.0e4),
    ("symbol_error_total", "counter", 0.0),
    ("unicast_packets_received_total", "counter", 2.2e6),
    ("unicast_packets_transmitted_total", "counter", 2.3e6),
    ("vl15_dropped_total", "counter", 0.0),
    ("rate_bytes_per_second", "gauge", None), ("state_id", "gauge", None),
    ("physical_state_id", "gauge", None),
)
GPUS = 8
PORTS = 8


def node_name(n: int) -> str:
    return f"gpu{n:05d}"


LAYOUTS = ("instance", "labels", "mixed")


def exporters(n: int, layout: str) -> tuple[bool, bool]:
    """(dcgm-exporter, node_exporter): which of the two node `n` has in `layout` (mixed:
    every fourth node dcgm-exporter's series only, the next node_exporter's only)."""
    if layout != "mixed":
        return True, True
    return n % 4 != 2, n % 4 != 1


# What a series' text leaves for each scrape to fill in: nothing (None), a counter's
# growth per second, or a moving gauge's values by phase.
Slot = float | list[str] | None


def families(n: int, layout: str) -> list[tuple[str, list[tuple[str, Slot]]]]:
    """Node `n`'s metric families: (the HELP and TYPE lines, its series), a series being
    (its text up to the value, then the counter's growth per second, or a moving
    gauge's values by phase; None: the value is in the text). With the labels layout
    node_exporter's series carry a `node` label too."""
    host = node_name(n)
    dcgm, node_exporter = exporters(n, layout)
    out: list[tuple[str, list[tuple[str, Slot]]]] = []
    if dcgm:
        for name, help_text, value in DCGM_GAUGES:
            spread = MOVING.get(name)
            out.append((f"# HELP {name} {help_text}\n# TYPE {name} gauge\n",
                        [(f'{name}{{{_dcgm_labels(n, i, host)}}} {value(n, i)}\n', None)
                         if spread is None else
                         (f'{name}{{{_dcgm_labels(n, i, host)}}} ',
                          phases(name, value(n, i), spread, n, i))
                         for i in range(GPUS)]))
        for name, help_text, rate in DCGM_COUNTERS:
            out.append((f"# HELP {name} {help_text}\n# TYPE {name} counter\n",
                        [(f"{name}{{{_dcgm_labels(n, i, host)}}} ", rate)
                         for i in range(GPUS)]))
    if not node_exporter:
        return out
    node = f',node="{host}"' if layout == "labels" else ""
    for name, kind, growth in IB:
        metric = f"node_infiniband_{name}"
        lines: list[tuple[str, Slot]] = []
        for p in range(PORTS):
            labels = f'{{device="mlx5_{p}"{node},port="1"}}'
            if growth is None:
                fixed = {"rate_bytes_per_second": 5e10, "state_id": 4,
                         "physical_state_id": 5}[name]
                lines.append((f"{metric}{labels} {fixed}\n", None))
            else:
                lines.append((f"{metric}{labels} ", growth))
        out.append((f"# HELP {metric} Infiniband {name}\n# TYPE {metric} {kind}\n", lines))
    out.append(("# HELP node_uname_info Labeled system information.\n"
                "# TYPE node_uname_info gauge\n",
                [(f'node_uname_info{{domainname="(none)",machine="x86_64"{node},'
                  f'nodename="{host}",release="5.15.0-91-generic",sysname="Linux",'
                  f'version="#101-Ubuntu"}} 1\n', None)]))
    return out


def _dcgm_labels(n: int, i: int, host: str) -> str:
    return (f'gpu="{i}",UUID="GPU-{n:05d}-{i}",device="nvidia{i}",'
            f'modelName="NVIDIA A800-SXM4-80GB",Hostname="{host}",'
            f'DCGM_FI_DRIVER_VERSION="535.129.03",DCGM_FI_PROCESS_NAME='
            f'"/usr/bin/dcgm-exporter"')


class Exposition:
    """One target's text, laid out once: fixed text between the counters. Given the
    families of one node, or of every node (each family's series together, as one
    exporter exposes them)."""

    def __init__(self, nodes: list[list[tuple[str, list[tuple[str, Slot]]]]]) -> None:
        # each counter's growth per second, or each moving gauge's values, in order
        self.slots: list[float | list[str]] = []
        self.parts: list[str] = []
        text: list[str] = []
        for i, (header, _) in enumerate(nodes[0] if nodes else []):
            text.append(header)
            for node in nodes:
                for line, slot in node[i][1]:
                    text.append(line)
                    if slot is not None:
                        self.parts.append("".join(text))
                        text.clear()
                        self.slots.append(slot)
                        text.append("\n")
        self.tail = "".join(text)

    def body(self, t: float) -> bytes:
        out = []
        phase = int(t / SCRAPE_S) % PHASES
        for part, slot in zip(self.parts, self.slots):
            out.append(part)
            out.append(slot[phase] if isinstance(slot, list) else str(int(slot * t)))
        out.append(self.tail)
        return "".join(out).encode()


def targets(nodes: int, layout: str) -> int:
    """How many scrape targets the fleet is."""
    return 1 if layout == "labels" else nodes


def scrape_configs(nodes: int, port: int, layout: str = "instance") -> str:
    """The `scrape_configs` entry that scrapes the fleet through the one server: with
    the instance and mixed layouts every node as its own instance (as node_exporter on
    each host would be); with the labels layout one target, all nodes' series behind it
    (`/metrics/all`), the node in their labels only."""
    if layout == "labels":
        return ("  - job_name: fleet\n    metrics_path: /metrics/all\n    static_configs: "
                + json.dumps([{"targets": [f"127.0.0.1:{port}"]}]) + "\n")
    targets = [{"targets": [f"127.0.0.1:{port}"], "labels": {"fleet_node": node_name(n)}}
               for n in range(nodes)]
    return ("  - job_name: fleet\n    static_configs: " + json.dumps(targets) + "\n"
            "    relabel_configs:\n"
            "      - source_labels: [fleet_node]\n        target_label: __metrics_path__\n"
            "        replacement: /metrics/$1\n"
            "      - source_labels: [fleet_node]\n        target_label: instance\n"
            "        replacement: $1:9100\n"
            "      - regex: fleet_node\n        action: labeldrop\n")


async def serve(nodes: int, port: int, ready: Path, layout: str = "instance") -> None:
    from aiohttp import web

    if layout == "labels":
        texts = {"all": Exposition([families(n, layout) for n in range(nodes)])}
    else:
        texts = {node_name(n): Exposition([families(n, layout)]) for n in range(nodes)}
    t0 = time.time() - 86400  # counters a day old

    async def metrics(request: web.Request) -> web.Response:
        text = texts.get(request.match_info["node"])
        if text is None:
            raise web.HTTPNotFound()
        return web.Response(body=text.body(time.time() - t0),
                            content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics/{node}", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    ready.write_text("ready")
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("nodes", type=int)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ready", type=Path, required=True)
    p.add_argument("--layout", choices=LAYOUTS, default="instance")
    args = p.parse_args()
    asyncio.run(serve(args.nodes, args.port, args.ready, args.layout))


if __name__ == "__main__":
    main()
