"""Why a node is slow, on data we did not write: real servers' PCI links, NVLink states,
InfiniBand inventories and nvidia-smi reports run through the agent's readers and the
link and fleet rules. A healthy real machine judged faulty is a bug like any other."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.collectors import pci
from agent.collectors.fabric import StatsReader
from agent.collectors.platform import PlatformReader, loaded_modules
from agent.files import FileTree
from agent.findings import NodeFindings
from agent.sim.fake_nvml import FakeGpu, FakeNvml
from tests.conftest import make_agent
from tests.nvidia_smi import fake_gpus, read_xml
from tests.trees import write
from tuimon_core.findings import Finding
from tuimon_core.fleet import fleet_findings, fleet_table
from tuimon_core.heat_levels import FABRIC_METRICS, LEVELS
from tuimon_core.link_rules import allowed_replays
from tuimon_core.protocol import Sample
from tuimon_core.protocol.messages import Hello

REAL = Path(__file__).resolve().parent / "fixtures" / "real"
CLASSES = {"3D controller": "0x030200", "VGA compatible controller": "0x030000",
           "Bridge": "0x068000", "PCI bridge": "0x060400", "Ethernet controller": "0x020000",
           "Infiniband controller": "0x020700"}


def fixture_rows(name: str) -> list[list[str]]:
    """A real-data fixture's rows, its `|` columns stripped (comment lines left out)."""
    return [[c.strip() for c in line.split("|")] for line in (REAL / name).read_text()
            .splitlines() if line and not line.startswith("#")]


def pci_device(root: Path, base: Path, cls: str, device: str, max_speed: str,
               max_width: str, speed: str, width: str) -> None:
    """One device's sysfs directory: vendor, class, links in the format the kernel
    writes (pci_speed_string), its driver; a value the capture lacks (`?`), no file."""
    vendor = "0x10de" if device.startswith("NVIDIA") else \
        "0x15b3" if device.startswith("Mellanox") else "0x8086"
    write(base / "vendor", vendor + "\n")
    write(base / "class", CLASSES.get(cls, "0x088000") + "\n")
    for key, value in (("max_link_speed", max_speed), ("current_link_speed", speed)):
        if value != "?":
            write(base / key, f"{float(value):.1f} GT/s PCIe\n")
    for key, value in (("max_link_width", max_width), ("current_link_width", width)):
        if value != "?":
            write(base / key, value + "\n")
    driver = root / "drivers" / ("nvidia" if vendor == "0x10de" else "mlx5_core")
    driver.mkdir(parents=True, exist_ok=True)
    os.symlink(driver, base / "driver")


def pci_tree(root: Path, name: str) -> list[list[str]]:
    """A /sys/bus/pci/devices tree with the devices, classes and links of a real
    server's `lspci -vvv`."""
    rows = fixture_rows(name)
    for address, cls, device, *link in rows:
        pci_device(root, root / "sys/bus/pci/devices" / address, cls, device, *link)
    return rows


def pci_paths_tree(root: Path, name: str) -> dict[str, list[str]]:
    """A real server's PCI tree (`pci_*_paths.txt`) as the kernel lays it out: each
    device's directory inside its upstream bridge's, under /sys/devices/pciDDDD:BB, and
    /sys/bus/pci/devices/<address> a relative symlink to it."""
    rows = {r[0]: r for r in fixture_rows(name)}
    for address, (_, cls, device, _kind, *link, _up) in rows.items():
        chain = [address]
        while rows[chain[-1]][8] != "-":
            chain.append(rows[chain[-1]][8])
        where = f"devices/pci{chain[-1][:7]}/" + "/".join(reversed(chain))
        pci_device(root, root / "sys" / where, cls, device, *link)
        bus = root / "sys/bus/pci/devices"
        bus.mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../../{where}", bus / address)
    return rows


def test_link_speeds_as_kernels_write_them() -> None:
    """Today's `pci_speed_string` (`16.0 GT/s PCIe`), kernels up to 5.6 (`16 GT/s`), an
    unknown speed, and widths as lane counts."""
    assert [pci.generation(s) for s in ("2.5 GT/s PCIe", "8.0 GT/s PCIe", "16 GT/s",
                                        "32.0 GT/s PCIe", "64.0 GT/s PCIe")] == [1, 3, 4, 5, 6]
    assert pci.generation("Unknown") is None and pci.generation("Unknown speed") is None
    assert pci.lanes("16\n") == 16 and pci.lanes("x4") == 4 and pci.lanes("0") is None
    # DCGM's replay limits: Gen5 x16 31 a minute, Gen4 x16 16, Gen3 x16 8, Gen1 x16 3.
    assert [allowed_replays(g, 16) for g in (5, 4, 3, 1)] == [31, 16, 8, 3]


def test_a_real_hgx_h100_bus_has_eight_gpus_and_its_links_are_whole(tmp_path: Path) -> None:
    """The bus of a real HGX H100: eight 3D controllers (the GPUs), four NVSwitches
    (class 0x0680, not GPUs), Gen5 x16 GPUs and ConnectX-7s, and Broadcom switch ports
    and root ports shown "downgraded" (normal, and never read: only endpoints are)."""
    rows = pci_tree(tmp_path, "pci_hgx_h100_lspci.txt")
    gpus = pci.nvidia_gpus(FileTree(tmp_path))
    assert len(gpus) == 8 and "0000:19:00.0" in gpus
    assert not set(gpus) & {r[0] for r in rows if r[1] == "Bridge"}
    downgraded = [r for r in rows if r[1] == "PCI bridge" and r[3:5] != r[5:7]]
    assert downgraded  # the real machine has them: the rules must not read bridges
    for address, _cls, device, *_ in rows:
        if device.startswith("Mellanox"):
            link = pci.link(FileTree(tmp_path), f"sys/bus/pci/devices/{address}")
            assert link["pcie_gen"] == link["pcie_gen_max"] and \
                link["pcie_width"] == link["pcie_width_max"], (address, link)


def _node(nvml: FakeNvml, root: Path, seconds: int = 40,
          tick: Callable[[int], None] | None = None) -> list[str]:
    """A real agent over a fake NVML holding a real server's values: the findings its
    rules hold after `seconds` of samples, as `kind: message`."""
    return [f"{f.kind}: {f.message}" for f in _findings(nvml, root, seconds, tick)]


def _findings(nvml: FakeNvml, root: Path, seconds: int = 40,
              tick: Callable[[int], None] | None = None) -> list[Finding]:
    """The findings a real agent's rules hold after `seconds` of samples over `nvml`."""
    import asyncio

    clock = [1000.0]
    agent = make_agent(root, nvml, interval=1.0, watch_xid=False)
    agent._monotonic = lambda: clock[0]  # type: ignore[method-assign]
    agent.findings = NodeFindings("node-a", lambda: clock[0])

    async def run() -> list[Finding]:
        await agent.start(sampling=False)
        try:
            for second in range(seconds):
                clock[0] += 1.0
                if tick is not None:
                    tick(second)
                await agent.sample_once()
            return list(agent.findings.active)
        finally:
            await agent.stop()
    return asyncio.run(run())


def real_gpus(model: str, count: int, **values: object) -> list[FakeGpu]:
    return [FakeGpu(i, name=model, util_gpu=95, **values) for i in range(count)]  # type: ignore[arg-type]


@pytest.mark.parametrize("what,gpus", [
    # nvidia-smi -q of a real 8x H100 80GB HBM3 (driver 565.57.01): Gen5 x16 of Gen5 x16,
    # 7, 4 and 15 replays since reset on three GPUs (thamada/gls H100SXMx8_smi.py).
    ("H100 SXM", [FakeGpu(i, name="NVIDIA H100 80GB HBM3", util_gpu=95,
                          pcie_replays=[7, 0, 0, 4, 15, 0, 0, 0][i]) for i in range(8)]),
    # 4x A100-SXM4-80GB: a Gen4 GPU in a Gen5 host, so NVML's Max is 4 (gls).
    ("A100 in a Gen5 host", real_gpus("NVIDIA A100-SXM4-80GB", 4, pcie_gen=4,
                                      pcie_gen_max=4, nvlinks=[1] * 12)),
    # GH200: the Hopper GPU hangs off Grace by C2C; nvidia-smi says Gen4 x1 of x1 (gls).
    ("GH200", real_gpus("NVIDIA GH200 480GB", 1, pcie_gen=4, pcie_gen_max=4, pcie_width=1,
                        pcie_width_max=1)),
    # 2x H100 PCIe with an NVLink bridge: 12 links up, 6 inactive on each (HPE's
    # nvidia-smi nvlink -s, DL380a Gen11).
    ("H100 PCIe, bridged", real_gpus("NVIDIA H100 PCIe", 2, nvlinks=[1] * 12 + [0] * 6)),
    # 2x A100 PCIe with no NVLink bridge: every link inactive on both (HPE).
    ("A100 PCIe, no bridge", real_gpus("NVIDIA A100-PCIE-40GB", 2, nvlinks=[0] * 12,
                                       pcie_gen=4, pcie_gen_max=4)),
])
def test_real_healthy_machines_raise_nothing(tmp_path: Path, what: str,
                                             gpus: list[FakeGpu]) -> None:
    assert _node(FakeNvml(gpus), tmp_path) == [], what


def test_idle_gpus_at_gen1_are_fine_and_a_busy_one_is_not(tmp_path: Path) -> None:
    """Four real RTX 6000 Ada idling at 2.5 GT/s of 16 (stelline's `lspci -vvv`): idle,
    nothing; the same link on a busy GPU is a downtrained link, named with its numbers."""
    rows = fixture_rows("pci_asus_rtx6000ada_lspci.txt")
    ada = [r for r in rows if "RTX 6000 Ada" in r[2]]
    assert len(ada) == 4 and all(r[5] == "2.5" and r[3] == "16" for r in ada)
    gen, gmax = pci.generation(f"{ada[0][5]} GT/s"), pci.generation(f"{ada[0][3]} GT/s")
    idle = [FakeGpu(i, name="NVIDIA RTX 6000 Ada Generation", util_gpu=0, pcie_gen=gen,
                    pcie_gen_max=gmax, nvlinks=None) for i in range(4)]
    assert _node(FakeNvml(idle), tmp_path / "a") == []
    busy = [FakeGpu(i, name="NVIDIA RTX 6000 Ada Generation", util_gpu=97 if i == 2 else 0,
                    pcie_gen=gen, pcie_gen_max=gmax, nvlinks=None) for i in range(4)]
    found = _node(FakeNvml(busy), tmp_path / "b")
    assert found == ["pcie_downtrained: node-a GPU 2 PCIe Gen1 x16 while busy, of Gen4 x16: "
                     "copies to and from the GPU run slower"], found


def test_replays_above_dcgms_limit_and_nvlink_errors_are_named(tmp_path: Path) -> None:
    """A GPU replaying a packet a second (60 a minute, above Gen5 x16's 31) and one whose
    NVLink retrained once: both named, with DCGM's limit."""
    gpus = real_gpus("NVIDIA H100 80GB HBM3", 8)

    def tick(second: int) -> None:
        gpus[3].pcie_replays += 1
        if second == 5:
            gpus[5].nvlink_recovery += 1
    found = _node(FakeNvml(gpus), tmp_path, tick=tick)
    assert "pcie_replays: node-a GPU 3 60 PCIe replays a minute, above the 31 DCGM allows " \
           "for Gen5 x16: a marginal link" in found, found
    assert "nvlink_errors: node-a GPU 5 NVLink +1 recovery errors in 10 min" in found, found
    assert len(found) == 2, found


def test_a_gpu_with_links_down_among_its_peers_and_one_missing_from_nvml(
        tmp_path: Path) -> None:
    """The real HGX bus has eight GPUs; NVML sees seven (the one at 0000:bb:00.0 is
    gone), and one of the seven has six of its eighteen NVLinks down."""
    pci_tree(tmp_path, "pci_hgx_h100_lspci.txt")
    addresses = [r[0] for r in fixture_rows("pci_hgx_h100_lspci.txt") if r[1] == "3D controller"]
    nvml = FakeNvml([FakeGpu(i, name="NVIDIA H100 80GB HBM3", util_gpu=95,
                             nvlinks=[1] * 12 + [0] * 6 if i == 1 else [1] * 18)
                     for i in range(7)])
    nvml.nvmlDeviceGetPciInfo = lambda h: type("Pci", (), {  # type: ignore[method-assign]
        "busId": f"0000{addresses[[0, 1, 2, 3, 4, 6, 7][h]].upper()}"})()
    found = _node(nvml, tmp_path)
    assert "gpu_missing: node-a: 7 of 8 GPUs visible to NVML: 0000:bb:00.0 missing (on the " \
           "PCI bus, not in NVML)" in found, found
    assert any(f.startswith("nvlink_down: node-a GPU 1: 12 of 18 NVLinks active; the node's "
                            "other NVIDIA H100 80GB HBM3 GPUs have 18") for f in found), found


def test_gpudirect_module_read_from_proc_modules(tmp_path: Path) -> None:
    """`/proc/modules` lines as the kernel writes them (taint flags, used-by lists)."""
    text = ("nvidia_peermem 16384 0 - Live 0xffffffffc1234000 (POE)\n"
            "nvidia_modeset 1183744 11 nvidia_drm, Live 0x0000000000000000 (POE)\n"
            "ib_uverbs 184320 3 nvidia_peermem,rdma_ucm,mlx5_ib, Live 0x0000000000000000\n")
    assert {"nvidia_peermem", "nvidia_modeset", "ib_uverbs"} == loaded_modules(text)
    write(tmp_path / "proc/modules", text)
    write(tmp_path / "proc/sys/kernel/osrelease", "5.15.0-119-generic\n")
    assert PlatformReader(FileTree(tmp_path)).read() == {
        "kernel": "5.15.0-119-generic", "pci_gpus": [], "gpudirect": "nvidia_peermem"}
    write(tmp_path / "proc/modules", text.splitlines()[1] + "\n")
    assert PlatformReader(FileTree(tmp_path)).read()["gpudirect"] == "none"


def ib_tree(root: Path, rows: list[list[str]], flags: dict[str, str] | None = None) -> None:
    """/sys/class/infiniband as the kernel writes it, from a fixture's rows (device,
    hca_type, board_id, fw_ver, port 1's rate, link_layer, state, phys_state; `-`: no
    file). `flags` gives a device's port a netdev (`<device>_eth`) with these sysfs
    `flags`: a RoCE port whose netdev is up (0x1003) or set down (0x1002)."""
    for device, hca, board, fw, rate, layer, state, phys in rows:
        dev = root / "sys/class/infiniband" / device
        for key, value in (("hca_type", hca), ("board_id", board), ("fw_ver", fw)):
            if value != "-":
                write(dev / key, value)  # gpud's files have no newline: both are read
        for key, value in (("rate", rate), ("link_layer", layer), ("state", state),
                           ("phys_state", phys)):
            write(dev / "ports/1" / key, value + "\n")
        if flags and device in flags:
            (dev / "device/net" / f"{device}_eth").mkdir(parents=True, exist_ok=True)
            write(root / "sys/class/net" / f"{device}_eth" / "flags", flags[device] + "\n")


class FabricNode:
    """One node as the agent judges its fabric: the real FabricCollector over a /sys tree
    (and a RoCE port's driver statistics from `ethtool`), the node rules through a
    FindingBook (agent.findings.NodeFindings), a sample a second."""

    def __init__(self, root: Path, name: str, ethtool: StatsReader | None = None) -> None:
        from agent.collectors.fabric import FabricCollector

        self.name, self.t, self.seq = name, 1000.0, 0
        self.fabric = FabricCollector(FileTree(root), ethtool=ethtool)
        self.findings = NodeFindings(name, lambda: self.t)
        self.ports: dict[str, dict] = {}

    def run(self, seconds: int, tick: Callable[[int], None] | None = None) -> list[Finding]:
        """Sample for `seconds`; the findings held then."""
        for second in range(seconds):
            if tick is not None:
                tick(second)
            self.t += 1.0
            self.seq += 1
            values, _ = self.fabric.collect(self.t)
            self.ports = {p["id"]: p for p in values["ports"]}
            self.findings.observe(None, Sample(self.seq, self.t, 1.0, gpus=[],
                                               extra={"fabric": values}))
        return self.findings.active

    def hello(self) -> Hello:
        return Hello(self.name, "0", None, 1.0, 0.0, extra=self.fabric.inventory())


def said(findings: list[Finding]) -> list[str]:
    return sorted(f"{f.severity} {f.kind}: {f.message}" for f in findings)


def test_a_fleet_of_real_hgx_nodes_names_the_port_below_rate_not_the_bluefield(
        tmp_path: Path) -> None:
    """Four nodes with a real HGX H100's HCAs (eight ConnectX-7 at 400 Gb/s, a BlueField-3
    at 200 on Ethernet): the BlueField is another model, not a slow port. One node whose
    mlx5_4 came up at 200 Gb/s and another on older firmware are named, with the devices
    that differ; nothing else. (Updated for #38: the comparison is by model and link layer
    on every device, so the model's name says its link layer and the devices are named.)"""
    rows = fixture_rows("infiniband_hgx_h100.txt")
    hellos = {}
    for n in range(4):
        mine = [list(r) for r in rows]
        for r in mine:
            if n == 2 and r[0] == "mlx5_4":
                r[4] = "200 Gb/sec (4X HDR)"
            if n == 3 and r[1] == "MT4129":
                r[3] = "28.39.1002"
        ib_tree(tmp_path / f"node{n}", mine)
        node = FabricNode(tmp_path / f"node{n}", f"gpu{n:03d}")
        node.run(1)
        hellos[node.name] = node.hello()
    found = sorted(f.message for f in fleet_findings(hellos))
    assert found == ["HCA firmware (MT4129 InfiniBand): 28.39.1002 on gpu003 (1 node: "
                     "mlx5_[0-1,4-9]); 28.41.1000 on 3",
                     "port rate (MT4129 InfiniBand): 200 Gb/s on gpu002 (1 node: mlx5_4); "
                     "400 Gb/s on 3"], found
    table = {(a.key, m): groups for a, m, groups in fleet_table(hellos)}
    assert [g.value for g in table[("port_rate", "MT41692 Ethernet")]] == [25e9]  # all four


def test_ports_that_are_down_have_no_rate_and_disabled_ones_are_information(
        tmp_path: Path) -> None:
    """Four real H100 hosts (gpud's ibstat captures): two healthy, one with two Ethernet
    ports Down and Disabled at `Rate: 40`, one with three. The fleet leaves those ports
    out of its rate comparison (it said "port rate (MT4129): 40 Gb/s on h100-c" beside
    the link_down), and a port disabled since the agent started is configured off: an
    information, not a critical link fault. The one real difference among them is named:
    h100-d's MT4125s run firmware 22.38.1002 where the others run 22.39.1002."""
    hosts = {"h100-a": "infiniband_h100_all_active_eth.txt",
             "h100-b": "infiniband_h100_all_active_eth.txt",
             "h100-c": "infiniband_h100_some_down_1.txt",
             "h100-d": "infiniband_h100_some_down_0.txt"}
    hellos, found = {}, {}
    for name, fixture in hosts.items():
        ib_tree(tmp_path / name, fixture_rows(fixture))
        node = FabricNode(tmp_path / name, name)
        found[name] = said(node.run(10))
        hellos[name] = node.hello()
    disabled = "info port_disabled: {} {}:1 disabled since first seen: configured off, not " \
        "a link fault"
    assert found == {"h100-a": [], "h100-b": [],
                     "h100-c": [disabled.format("h100-c", d) for d in ("mlx5_11", "mlx5_5")],
                     "h100-d": [disabled.format("h100-d", d)
                                for d in ("mlx5_2", "mlx5_7", "mlx5_8")]}, found
    assert [f.message for f in fleet_findings(hellos)] == [
        "HCA firmware (MT4125 Ethernet): 22.38.1002 on h100-d (1 node: mlx5_[1-2,7-8]); "
        "22.39.1002 on 3"]
    # The rate is still read and shown; the fleet just does not compare it.
    assert {p["rate_text"] for p in hellos["h100-c"].extra["ports"] if p["up"] == 0} == {
        "40 Gb/sec"}


def test_a_port_disabled_while_in_use_is_a_warning_and_polling_a_link_fault(
        tmp_path: Path) -> None:
    """A real healthy host whose mlx5_5 then reads as the same port of a real host with it
    disabled (Down, Disabled, 40): someone or something turned a working port off, a
    warning. gpud's Polling copy of that host (hand-edited upstream, see its fixture) has
    mlx5_11 Polling: no peer or no signal, a link fault."""
    healthy = fixture_rows("infiniband_h100_all_active_eth.txt")
    down = {r[0]: r for r in fixture_rows("infiniband_h100_some_down_1.txt")}
    ib_tree(tmp_path / "a", healthy)
    node = FabricNode(tmp_path / "a", "h100-a")
    assert node.run(10) == []
    assert node.hello().extra["ports"][7]["up"] == 1
    ib_tree(tmp_path / "a", [down["mlx5_5"]])
    assert said(node.run(10)) == [
        "warning port_disabled: h100-a mlx5_5:1 disabled while in use (it was ACTIVE, "
        "LinkUp): someone or something turned it off"]
    assert {p["device"]: p["up"] for p in node.hello().extra["ports"]}["mlx5_5"] == 0

    ib_tree(tmp_path / "p", fixture_rows("infiniband_h100_some_down_polling.txt"))
    polling = FabricNode(tmp_path / "p", "h100-p")
    found = said(polling.run(10))
    assert found == ["critical link_down: h100-p mlx5_11:1 link DOWN (Polling)",
                     "info port_disabled: h100-p mlx5_5:1 disabled since first seen: "
                     "configured off, not a link fault"], found
    # The map's errors level says the same of the real ports as the rules: the two that
    # carry nothing at the top, every other port clean (one rule, port_down).
    (errors,) = (m for m in FABRIC_METRICS if m.key == "errors")
    at_top = sorted(pid for pid, p in polling.ports.items() if errors.level(p) == LEVELS - 1)
    assert at_top == ["mlx5_11:1", "mlx5_5:1"], at_top
    assert all(errors.level(p) == 0 for pid, p in polling.ports.items() if pid not in at_top)


def test_a_roce_port_without_carrier_is_a_link_fault_one_set_down_is_not(
        tmp_path: Path) -> None:
    """mlx5 reads a RoCE port Disabled whenever its netdev is not running with carrier
    (drivers/infiniband/hw/mlx5/main.c, mlx5_query_port_roce), so only the netdev's
    IFF_UP tells a port someone set down from a cable gone dark. The real host's two
    Disabled ports, with netdevs whose flags we wrote: one up (no carrier), one down."""
    ib_tree(tmp_path, fixture_rows("infiniband_h100_some_down_1.txt"),
            flags={"mlx5_5": "0x1003", "mlx5_11": "0x1002"})
    found = said(FabricNode(tmp_path, "h100-c").run(10))
    assert found == [
        "critical link_down: h100-c mlx5_5:1 link DOWN (Disabled, no carrier while its "
        "netdev is up: cable, transceiver or the switch port)",
        "info port_disabled: h100-c mlx5_11:1 set down (its netdev is down) since first "
        "seen: configured off, not a link fault"], found


def test_firmware_is_compared_by_model_and_link_layer_on_every_device(
        tmp_path: Path) -> None:
    """A real A100 host's Ethernet mlx5_0 (22.35.2302) and eight InfiniBand HCAs
    (28.37.1014) all say MT4126. One firmware per model, the lowest, read 22.35.2302 on
    every node, so a node whose InfiniBand HCAs run another firmware raised nothing.
    Five such nodes: gpu003's eight InfiniBand HCAs on 28.35.1012 and gpu004's mlx5_4
    alone on it (derived: the firmware written by us) are named, with their devices; the
    healthy three and every Ethernet mlx5_0 are not."""
    rows = fixture_rows("infiniband_a100_mt4126_eth_and_ib.txt")
    hellos = {}
    for n in range(5):
        mine = [list(r) for r in rows]
        for r in mine:
            if (n == 3 and r[5] == "InfiniBand") or (n == 4 and r[0] == "mlx5_4"):
                r[3] = "28.35.1012"
        ib_tree(tmp_path / f"n{n}", mine)
        node = FabricNode(tmp_path / f"n{n}", f"gpu{n:03d}")
        assert node.run(1) == []
        hellos[node.name] = node.hello()
    healthy = {k: v for k, v in hellos.items() if k < "gpu003"}
    assert fleet_findings({**healthy, "gpu005": hellos["gpu000"]}) == []
    assert [f.message for f in fleet_findings(hellos)] == [
        "HCA firmware (MT4126 InfiniBand): 28.35.1012 and 28.37.1014 on gpu004 (1 node: "
        "mlx5_4); 28.35.1012 on gpu003 (1 node: mlx5_[1-8]); 28.37.1014 on 3"]


def test_the_fake_nvml_answers_with_nvidia_ml_pys_names_and_arguments() -> None:
    """The stand-in is only worth what it mirrors: every NVML call it answers exists in
    the installed nvidia-ml-py under the same name and takes as many arguments."""
    import inspect

    import pynvml

    fake = FakeNvml(1)
    calls = [n for n in dir(type(fake)) if n.startswith("nvml") and callable(getattr(fake, n))]
    assert len(calls) > 30
    for name in calls:
        real = getattr(pynvml, name, None)
        assert real is not None, f"pynvml has no {name}"
        want = [p for p in inspect.signature(real).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                       p.POSITIONAL_OR_KEYWORD)]
        have = [p for p in inspect.signature(getattr(fake, name)).parameters.values()
                if p.default is p.empty]
        assert len(have) == len(want), (name, want, have)
    assert fake.NVML_NVLINK_MAX_LINKS == pynvml.NVML_NVLINK_MAX_LINKS


class Driver:
    """A RoCE port's driver statistics by netdev, as the ethtool ioctl reads them; a netdev
    it does not hold has none (EOPNOTSUPP)."""

    def __init__(self, **netdevs: dict[str, int]) -> None:
        self.netdevs = netdevs

    def read(self, ifname: str) -> dict[str, int]:
        if ifname not in self.netdevs:
            raise OSError(95, f"{ifname}: EOPNOTSUPP: the driver has no statistics")
        return dict(self.netdevs[ifname])

    def close(self) -> None:
        pass


def roce_node(root: Path, driver: Driver, ports: int = 1) -> FabricNode:
    """A node with RoCE ports mlx5_0.. (netdevs ens1f0np0..), read through `driver`."""
    from tests.trees import ib_port

    for i in range(ports):
        ib_port(root, f"mlx5_{i}", link_layer="Ethernet", netdev=f"ens1f{i}np{i}")
    return FabricNode(root, "roce01", ethtool=driver)


def test_a_roce_port_that_pauses_its_peer_is_named(tmp_path: Path) -> None:
    """A RoCE port whose netdev's driver statistics (the counter names and values of a
    real ConnectX-4 Lx: global pause, no PFC, durations in microseconds) say it held its
    peer off 30 % of each second: its share is on the wire, and the node names it as
    global pause (it said "PFC": the port has none); a netdev whose statistics cannot be
    read says why, and the rest of the port is read."""
    from tests.test_ethtool_stats import CX4LX, parse_ethtool_s

    counters = parse_ethtool_s(CX4LX)
    node = roce_node(tmp_path, Driver(ens1f0np0=counters), ports=2)

    def tick(second: int) -> None:
        counters["tx_global_pause_duration"] += 300_000  # 0.3 s of each second
        counters["tx_global_pause"] += 6000
    found = node.run(15, tick)
    ports = node.ports
    assert ports["mlx5_0:1"]["paused_tx"] == pytest.approx(0.3)
    assert ports["mlx5_0:1"]["pause_tx_s"] == pytest.approx(6000)
    assert ports["mlx5_0:1"]["pause_by"] == "global" and ports["mlx5_0:1"]["pfc"] == []
    assert "EOPNOTSUPP" in ports["mlx5_1:1"]["counter_errors"]["ethtool"]
    assert ports["mlx5_1:1"]["tx_bytes_s"] is not None
    assert said(found) == [
        "warning pfc_pausing: roce01 mlx5_0:1 holds its peer off 30% of the time (global "
        "pause)"]


def flood(counters: dict[str, int], prio: int, arrive: int, drop: int) -> None:
    """A second of traffic on one priority as mlx5 counts it: `arrive` packets reach the
    port and `drop` of them are dropped for lack of buffer, counted by the priority's
    discards and by the port's (the same drops twice); the rest are the priority's
    packets. The port's packets count both."""
    counters[f"rx_prio{prio}_packets"] = counters.get(f"rx_prio{prio}_packets", 0) + arrive - drop
    counters[f"rx_prio{prio}_discards"] = counters.get(f"rx_prio{prio}_discards", 0) + drop
    counters["rx_packets_phy"] = counters.get("rx_packets_phy", 0) + arrive
    counters["rx_discards_phy"] = counters.get("rx_discards_phy", 0) + drop


def test_drops_under_an_xdp_flood_without_pfc_are_counted_once_and_information(
        tmp_path: Path) -> None:
    """A real mlx5 port under an XDP_DROP flood (the 6.5 dump of the bpf mailing list's
    2024-06-19 post: global pause only, 441063206498 drops of 728277471186 packets, the
    same drops in rx_discards_phy and rx_prio0_discards), carried on at its own share: a
    million packets a second, 61 % dropped (the rate is ours). It was "drops 1,211,250
    lossless packets a second" and a warning: twice the drops, called lossless, on a
    port with no PFC. Now: counted once, and information (a benchmark's flood on a plain
    Ethernet port is no fault of the fabric)."""
    from tests.test_ethtool_stats import XDP_K65

    counters = dict(XDP_K65)
    share = XDP_K65["rx_prio0_discards"] / XDP_K65["rx_packets_phy"]
    drop = round(1_000_000 * share)
    node = roce_node(tmp_path, Driver(ens1f0np0=counters))
    found = node.run(40, lambda s: flood(counters, 0, 1_000_000, drop))
    port = node.ports["mlx5_0:1"]
    assert port["discards_s"] == drop and port["arrived_s"] == 1_000_000
    assert "lossless_discards_s" not in port or port["lossless_discards_s"] is None
    assert said(found) == [
        f"info port_drops: roce01 mlx5_0:1 drops {drop:,} packets a second (61% of what "
        "arrives; no PFC on this port: lossy traffic, its senders recover)"]


def test_a_pfc_priority_dropping_is_a_warning_and_a_healthy_one_is_silent(
        tmp_path: Path) -> None:
    """A real ConnectX-4 Lx with PFC on priority 0 (the GPUDirect blog post: rx_prio0_pause
    from 0 to 12667 and tx_prio0_pause to 80 over its test, rx_discards_phy 0): pausing a
    little and dropping nothing, it raises nothing. Then (derived) its priority 0 drops
    0.5 % of 2 million packets a second, and it pauses its peer 30 % of the time: lossless
    traffic lost, a warning, and the pause named PFC on priority 0."""
    counters = {"rx_prio0_pause": 0, "tx_prio0_pause": 0, "rx_prio0_pause_duration": 0,
                "tx_prio0_pause_duration": 0, "rx_prio0_pause_transition": 0}
    node = roce_node(tmp_path, Driver(ens1f0np0=counters))

    def pausing(second: int) -> None:
        counters["rx_prio0_pause"] += 12667 // 30
        counters["tx_prio0_pause"] += 80 // 30
        counters["rx_prio0_pause_duration"] += 200
    assert node.run(30, lambda s: (pausing(s), flood(counters, 0, 2_000_000, 0))) == []
    assert node.ports["mlx5_0:1"]["pfc"] == [0]

    def faulty(second: int) -> None:
        pausing(second)
        flood(counters, 0, 2_000_000, 10_000)
        counters["tx_prio0_pause_duration"] += 300_000
    found = node.run(40, faulty)
    assert node.ports["mlx5_0:1"]["lossless_discards_s"] == 10_000
    assert said(found) == [
        "warning pfc_pausing: roce01 mlx5_0:1 holds its peer off 30% of the time (PFC, "
        "priority 0)",
        "warning port_drops: roce01 mlx5_0:1 drops 10,000 lossless packets a second (PFC "
        "priority 0; 0.5% of what arrives there): the senders resend, the job waits"]


@pytest.mark.parametrize("what,arrive,drops", [
    ("under the rate: 50 a second, 1 % of what arrives", [5_000] * 40, [50] * 40),
    ("under the share: 1,000 a second of 100 million", [100_000_000] * 40, [1_000] * 40),
    ("one second's burst, averaged over the window", [2_000_000] * 40,
     [0] * 20 + [2_500] + [0] * 19),
])
def test_lossless_drops_below_the_thresholds_raise_nothing(
        tmp_path: Path, what: str, arrive: list[int], drops: list[int]) -> None:
    """Both the rate (node_rules.DROP_RATE) and the share (DROP_SHARE) must hold, over the
    window (DROP_WINDOW_S), on a PFC priority: below either, a lossless port's drops cost
    the job nothing it would notice."""
    from tuimon_core.node_rules import DROP_RATE, DROP_SHARE, DROP_WINDOW_S

    assert (DROP_RATE, DROP_SHARE, DROP_WINDOW_S) == (100.0, 1e-4, 30.0)
    counters = {"rx_prio3_pause": 0, "tx_prio3_pause": 0}
    node = roce_node(tmp_path, Driver(ens1f0np0=counters))
    assert node.run(40, lambda s: flood(counters, 3, arrive[s], drops[s])) == [], what


# -- throttling, judged by its effect (tests/fixtures/real/nvidia_smi/) --------------------

SMI = REAL / "nvidia_smi"


@pytest.mark.parametrize("capture", [
    # One H100 idle at 39 °C, 118 of 700 W, SM 1980 of 1980 MHz, with SW Power Cap, HW
    # Power Brake and SW Thermal Slowdown set: the bits without their effect. It was
    # "thermal throttling at 39 °C".
    "h100x8_reasons_at_max_clock_535.183.01.txt",
    # Two A40s with SW Power Cap set while idle at a tenth of their 300 W, SM 0 MHz.
    "a40x10_idle_power_cap_550.127.05.txt",
])
def test_throttle_reasons_without_their_effect_raise_nothing(tmp_path: Path,
                                                             capture: str) -> None:
    assert _node(FakeNvml(fake_gpus(SMI / capture)), tmp_path) == [], capture


def test_a_gpu_at_its_power_limit_is_information_not_a_fault(tmp_path: Path) -> None:
    """Two RTX 4090s at 97 and 100 % drawing 445 and 446 of their 450 W, held at 2640 and
    2520 of 3105 MHz by SW Power Cap: a power cap, said once for the node."""
    found = _findings(FakeNvml(fake_gpus(SMI / "rtx4090x8_power_cap_535.154.05.txt")),
                      tmp_path)
    assert [(f.severity, f.kind, f.message) for f in found] == [
        ("info", "power", "node-a GPU 1,4 power-capped (sw_power_cap)")]


def test_a_hardware_power_brake_that_collapsed_the_clocks_is_a_fault(tmp_path: Path) -> None:
    """Eight real H100s with HW Slowdown and HW Power Brake set and the SM clock at 86 of
    1980 MHz, idle (below the 345 MHz healthy H100s idle at): a warning naming the eight.
    The same GPUs given work (real-derived: utilization 95 %): critical."""
    gpus = fake_gpus(SMI / "h100x8_hw_power_brake_535.161.08.txt")
    found = _findings(FakeNvml(gpus), tmp_path / "idle")
    assert [(f.severity, f.kind, f.message) for f in found] == [
        ("warning", "hw_slowdown", "node-a GPU 0,1,2,3,4,5,6,7 hardware slowdown while idle: "
         "SM 86 of 1980 MHz (hw_power_brake_slowdown, hw_slowdown)")]
    for g in gpus:
        g.util_gpu = 95
    found = _findings(FakeNvml(gpus), tmp_path / "busy")
    assert [(f.severity, f.kind) for f in found] == [("critical", "hw_slowdown")], found


def test_a_mig_gpus_link_is_judged_busy_by_its_power(tmp_path: Path) -> None:
    """A real A100-SXM4-80GB in MIG mode (telegraf's `nvidia-smi -q -x`): utilization N/A
    (NVML answers NOT_SUPPORTED in MIG mode), four instances, 67 of 500 W, Gen4 x16 of
    Gen4: idle by its power, nothing to say. Real-derived: the same GPU drawing 450 W
    with its link at Gen1 is a link downtrained while busy, and says how busy was known."""
    from agent.sim.fake_nvml import FakeMig

    [real] = read_xml(SMI / "a100_sxm4_mig_535.54.03.xml")
    assert real["mig"] == "Enabled" and real["util"] == "N/A" and real["instances"] == 4

    def gpu(power_w: float, gen: int) -> FakeGpu:
        return FakeGpu(0, name=real["name"], power_mw=int(power_w * 1000),
                       power_limit_mw=int(real["power_limit"] * 1000),
                       sm_mhz=int(real["sm"]), max_sm_mhz=int(real["max_sm"]),
                       pcie_gen=gen, pcie_gen_max=4, nvlinks=[1] * 12,
                       mig=[FakeMig(gi) for gi in (3, 4, 5, 6)])
    assert _node(FakeNvml([gpu(real["power"], 4)]), tmp_path / "real") == []
    assert _node(FakeNvml([gpu(real["power"], 1)]), tmp_path / "idle-gen1") == []
    found = _node(FakeNvml([gpu(450.0, 1)]), tmp_path / "busy")
    assert found == ["pcie_downtrained: node-a GPU 0 PCIe Gen1 x16 while busy (power drawn), "
                     "of Gen4 x16: copies to and from the GPU run slower"], found


def test_a_bridged_pair_that_loses_one_more_nvlink_is_named(tmp_path: Path) -> None:
    """Two H100 PCIe with an NVLink bridge, 12 of 18 links up on each (HPE's `nvidia-smi
    nvlink -s`, links 4, 5, 10, 11, 16 and 17 inactive: normal, and silent). Real-derived:
    GPU 1 loses link 3 while the agent runs (11 of 18). Of two GPUs neither is a
    majority: the GPU is compared with what it had."""
    bridged = [1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0]
    gpus = real_gpus("NVIDIA H100 PCIe", 2)
    for g in gpus:
        g.nvlinks = list(bridged)

    def tick(second: int) -> None:
        if second == 10:
            gpus[1].nvlinks[3] = 0
    found = _node(FakeNvml(gpus), tmp_path, tick=tick)
    assert found == ["nvlink_down: node-a GPU 1: 11 of 18 NVLinks active; it had 12"], found


def test_gpus_on_the_bus_with_nvml_unable_to_load_are_critical(tmp_path: Path) -> None:
    """A real HGX H100's bus (eight 3D controllers) on a node whose NVML cannot load:
    the node is critical, naming the count and NVML's reason; the viewer's own rule for
    a node without GPUs does not say it again. A CPU node without GPUs on its bus whose
    NVML is absent says nothing."""
    from tuimon.model.cluster import ClusterState
    from tuimon.model.diagnosis import Diagnosis
    from tuimon.model.efficiency import EfficiencyView
    from tuimon.model.storage import StorageView
    from tuimon_core.protocol import decode, encode

    pci_tree(tmp_path / "gpu", "pci_hgx_h100_lspci.txt")

    def missing() -> FakeNvml:  # nvmlInit raises as without libnvidia-ml.so.1
        return FakeNvml(0, driver=False)

    found = _findings(missing(), tmp_path / "gpu")
    assert [(f.severity, f.kind) for f in found] == [("critical", "gpu_missing")], found
    assert found[0].message.startswith("node-a: 8 GPUs on the PCI bus, none usable: "), found
    assert "Library Not Found" in found[0].message
    write(tmp_path / "cpu/proc/modules", "")
    assert _findings(missing(), tmp_path / "cpu") == []
    # The viewer of that node (its agent's frames) names it once.
    agent = make_agent(tmp_path / "gpu", missing(), interval=1.0, watch_xid=False)
    import asyncio

    async def frames() -> list[object]:
        await agent.start(sampling=False)
        try:
            await agent.sample_once()
            assert agent.hello is not None and agent.latest is not None
            return [decode(encode(agent.hello)), decode(encode(agent.latest))]
        finally:
            await agent.stop()
    hello, sample = asyncio.run(frames())
    cluster = ClusterState()
    cluster.apply_message("node-a:9477", hello)
    cluster.apply_message("node-a:9477", sample)
    kinds = [f.kind for f in Diagnosis().update(cluster, EfficiencyView(), StorageView())]
    assert "gpu_init_failed" not in kinds


# -- the path from a device to its root port ------------------------------------------

HGX = "pci_hgx_h100_paths.txt"


def _on_real_bus(nvml: FakeNvml, addresses: list[str]) -> FakeNvml:
    """NVML's GPUs at a real server's PCI addresses, in order (NVML's busId form)."""
    nvml.nvmlDeviceGetPciInfo = lambda h: type("Pci", (), {  # type: ignore[method-assign]
        "busId": f"0000{addresses[h].upper()}"})()
    return nvml


def _hcas(root: Path, addresses: list[str]) -> list[str]:
    """An InfiniBand device mlx5_N for each address, its `device` link into the PCI tree
    as the kernel makes it; the names are ours (the capture has no /sys/class)."""
    from tests.trees import ib_port

    names = []
    for n, address in enumerate(addresses):
        name = f"mlx5_{n}"
        ib_port(root, name)
        target = os.readlink(root / "sys/bus/pci/devices" / address)  # ../../../devices/..
        os.symlink(target, root / "sys/class/infiniband" / name / "device")
        names.append(name)
    return names


def _hgx(root: Path, util: int = 95) -> tuple[FakeNvml, dict[str, list[str]]]:
    """The real HGX H100's tree, its eight GPUs in NVML (busy at `util` %), its twelve
    Mellanox functions as mlx5_0..11 in address order."""
    rows = pci_paths_tree(root, HGX)
    gpus = [a for a, r in rows.items() if r[1] == "3D controller"]
    _hcas(root, [a for a, r in rows.items() if r[2].startswith("Mellanox")])
    nvml = _on_real_bus(FakeNvml([FakeGpu(i, name="NVIDIA H100 80GB HBM3", util_gpu=util)
                                  for i in range(len(gpus))]), gpus)
    return nvml, rows


def test_the_paths_of_a_real_hgx_h100_are_the_links_lspci_shows(tmp_path: Path) -> None:
    """Each GPU's and NIC's path, read from the sysfs tree of a real HGX H100: its own
    link from a PEX890xx downstream port, then the switch's uplink from a root port, as
    lspci's port types say (the agent reads no port type: it counts depth). The maxima
    are each end's LnkCap, the state now LnkSta."""
    rows = pci_paths_tree(tmp_path, HGX)
    paths = pci.PciPaths(FileTree(tmp_path))
    devices = [a for a, r in rows.items() if r[1] == "3D controller" or
               r[2].startswith("Mellanox")]
    assert len(devices) == 20  # 8 GPUs, 8 ConnectX-7, 2 ConnectX-6 Dx with two functions
    for address in devices:
        hops = paths.read(address, with_now=True)
        assert hops is not None and hops[0]["down"] == address, address
        for hop in hops:
            up, down = rows[hop["up"]], rows[hop["down"]]
            assert down[8] == hop["up"]  # one link: the device below the port above
            assert up[3] == ("Root Port" if hop["up_kind"] == "root" else "Downstream Port")
            assert down[3] in ("Endpoint", "Upstream Port")
            assert (hop["up_gen_max"], hop["up_width_max"], hop["gen"], hop["width"]) == (
                pci.generation(f"{up[4]} GT/s"), int(up[5]), pci.generation(f"{down[6]} GT/s"),
                int(down[7]))
        assert hops[-1]["up_kind"] == "root" and len(hops) == 2
    assert paths.read("0000:19:00.0") == [
        {"up": "0000:17:01.0", "down": "0000:19:00.0", "up_kind": "switch", "up_gen_max": 5,
         "up_width_max": 16, "down_gen_max": 5, "down_width_max": 16},
        {"up": "0000:15:01.0", "down": "0000:16:00.0", "up_kind": "root", "up_gen_max": 5,
         "up_width_max": 16, "down_gen_max": 5, "down_width_max": 16}]


def test_a_real_healthy_hgx_h100_raises_nothing_on_its_paths(tmp_path: Path) -> None:
    """The real machine as captured, its eight GPUs busy: the switch ports lspci shows
    "downgraded" (16 GT/s of 32 to a Gen4 ConnectX-6 Dx and to Gen4 NVMe drives, x2 of
    x16 to the NVSwitches' management) are at what both ends support, and nothing of a
    device is below what its slot allows: no finding, not even an informational one."""
    nvml, rows = _hgx(tmp_path)
    cx6 = pci.PciPaths(FileTree(tmp_path)).read("0000:1b:00.0", with_now=True) or []
    assert rows["0000:17:03.0"][4:8] == ["32", "16", "16", "16"]  # the real "downgraded"
    assert (cx6[0]["up"], cx6[0]["up_gen_max"], cx6[0]["down_gen_max"], cx6[0]["gen"]) == (
        "0000:17:03.0", 5, 4, 4)
    assert _node(nvml, tmp_path) == []


def test_a_switch_uplink_at_gen4_is_named_while_a_gpu_behind_it_is_busy(
        tmp_path: Path) -> None:
    """Real-derived: the real HGX H100 with one change, the link from root port
    0000:15:01.0 to the switch above GPU 0 (and mlx5_0..2) trained at 16 GT/s of 32
    (both ends' LnkSta rewritten). GPU 0 and its own link look perfect to NVML. Idle,
    nothing (an idle GPU's links may drop); busy, the link is named once, with the
    devices behind it; every other switch's uplink is whole."""
    for util, root in ((0, tmp_path / "idle"), (95, tmp_path / "busy")):
        nvml, _ = _hgx(root, util)
        for end in ("0000:15:01.0", "0000:15:01.0/0000:16:00.0"):
            write(root / "sys/devices/pci0000:15" / end / "current_link_speed",
                  "16.0 GT/s PCIe\n")
        found = _node(nvml, root)
        if util == 0:
            assert found == [], found
            continue
        assert found == [
            "pcie_downtrained: node-a GPU 0 PCIe path: root port 0000:15:01.0 -> "
            "0000:16:00.0 at Gen4 x16 of Gen5 x16 while busy (also behind it: mlx5_0, "
            "mlx5_1, mlx5_2)"], found


def test_an_hca_in_a_slot_below_its_own_maximum_is_configuration_not_a_fault(
        tmp_path: Path) -> None:
    """node_exporter's real sysfs: a Gen4 x4 device below a root port that supports Gen3
    x8, trained at Gen3 x4: as fast as both ends allow. Taken as an HCA (its class and
    vendor are an NVMe drive's; the rule reads neither): an agent that reads the path
    names the slot, as information; without the path (an older agent's hello), the HCA
    reads as downtrained against its own maximum, as it did."""
    from agent.collectors.fabric import FabricCollector
    from tuimon_core.link_rules import LinkRules
    from tuimon_core.protocol.messages import Hello

    pci_paths_tree(tmp_path, "pci_node_exporter_paths.txt")
    _hcas(tmp_path, ["0000:01:00.0"])
    fabric = FabricCollector(FileTree(tmp_path))
    fabric.collect(0.0)
    port = fabric.inventory()["ports"][0]
    assert (port["pcie_gen"], port["pcie_gen_max"], port["pcie_width"]) == (3, 4, 4)

    def judged(ports: list[dict[str, object]]) -> list[str]:
        hello = Hello("node-a", "0", None, 1.0, 0.0, extra={"ports": ports})
        sample = Sample(1, 0.0, 1.0, gpus=[])
        return [f"{f.kind}: {f.message}" for f in LinkRules("node-a").conditions(
            hello, sample, 0.0)]
    assert judged([port]) == [
        "pcie_slot_limited: node-a mlx5_0 PCIe path: root port 0000:00:02.1 supports Gen3 "
        "x8, mlx5_0 Gen4 x4: it cannot reach its own maximum"]
    assert judged([{k: v for k, v in port.items() if k != "pcie_path"}]) == [
        "pcie_downtrained: node-a mlx5_0 PCIe Gen3 x4, of Gen4 x4: the HCA cannot reach its "
        "line rate"]


def test_what_a_hello_says_is_judged_again_when_a_new_hello_comes() -> None:
    """One node's rules over many samples: an HCA trained below its maximum is named
    every second its hello says so (the hello's findings judged once per hello), and no
    longer once a new hello says it trained at its maximum again."""
    from tuimon_core.link_rules import LinkRules
    from tuimon_core.protocol.messages import Hello

    def hello(gen: int) -> Hello:
        return Hello("node-a", "0", None, 1.0, 0.0, extra={"ports": [
            {"id": "mlx5_0:1", "device": "mlx5_0", "pcie_gen": gen, "pcie_gen_max": 4,
             "pcie_width": 16, "pcie_width_max": 16}]})

    rules = LinkRules("node-a")
    slow, fast = hello(3), hello(4)
    for t in range(3):
        assert [f.kind for f in rules.conditions(
            slow, Sample(t, float(t), 1.0, gpus=[]), float(t))] == ["pcie_downtrained"]
    assert rules.conditions(fast, Sample(3, 3.0, 1.0, gpus=[]), 3.0) == []
    assert [f.message for f in rules.conditions(
        hello(3), Sample(4, 4.0, 1.0, gpus=[]), 4.0)] == [
        "node-a mlx5_0 PCIe Gen3 x16, of Gen4 x16: the HCA cannot reach its line rate"]


def test_gpus_below_root_ports_whose_links_were_not_captured(tmp_path: Path) -> None:
    """Stelline's real Threadripper PRO: two RTX 6000 Ada idling at 2.5 GT/s of 16, each
    straight below a root port whose link is not in the capture (no files): the root
    port's end is unknown, never guessed; idle, nothing; busy, only the GPU's own link."""
    rows = pci_paths_tree(tmp_path, "pci_puget_wrx90_paths.txt")
    gpus = [a for a, r in rows.items() if "RTX 6000 Ada" in r[2]]
    hops = pci.PciPaths(FileTree(tmp_path)).read(gpus[0], with_now=True)
    assert hops == [{"up": "0000:c0:01.1", "down": "0000:c1:00.0", "up_kind": "root",
                     "up_gen_max": None, "up_width_max": None, "down_gen_max": 4,
                     "down_width_max": 16, "gen": 1, "width": 16}]
    for util, root in ((0, tmp_path / "idle"), (97, tmp_path / "busy")):
        pci_paths_tree(root, "pci_puget_wrx90_paths.txt")
        nvml = _on_real_bus(FakeNvml([FakeGpu(i, name="NVIDIA RTX 6000 Ada Generation",
                                              util_gpu=util, pcie_gen=1, pcie_gen_max=4,
                                              nvlinks=None) for i in range(2)]), gpus)
        found = _node(nvml, root)
        assert found == ([] if util == 0 else [
            f"pcie_downtrained: node-a GPU {i} PCIe Gen1 x16 while busy, of Gen4 x16: "
            "copies to and from the GPU run slower" for i in range(2)]), found


def test_a_broken_tree_reads_as_unknown_links_never_an_error(tmp_path: Path) -> None:
    """A link state of garbage, a missing file, a switch port's directory a symlink loop,
    a device whose bus symlink leaves /sys/devices or names no PCI address: what cannot
    be read is unknown (None: that end, that link, or the whole path), nothing is
    judged on it, and the agent runs on."""
    nvml, _ = _hgx(tmp_path)
    sysfs = tmp_path / "sys/devices"
    write(sysfs / "pci0000:37/0000:37:01.0/0000:38:00.0/current_link_speed", "fast\n")
    (sysfs / "pci0000:37/0000:37:01.0/0000:38:00.0/max_link_width").unlink()
    switch = sysfs / "pci0000:48/0000:48:01.0/0000:49:00.0"
    moved = switch.with_name("moved")
    switch.rename(moved)
    os.symlink(switch.name, switch)  # a link to itself: every read below it is ELOOP
    bus = tmp_path / "sys/bus/pci/devices"
    for address, target in (("0000:5d:00.0", "../../../../../etc"),
                            ("0000:9b:00.0", "../../../devices/pci0000:97/garbage/0000:9b:00.0")):
        (bus / address).unlink()
        os.symlink(target, bus / address)
    paths = pci.PciPaths(FileTree(tmp_path))
    second = paths.read("0000:3b:00.0", with_now=True) or []
    assert (second[1]["down_width_max"], second[1]["gen"], second[1]["width"]) == (
        None, 5, 16)  # the speed read from the root port's end, the same link
    own, uplink = paths.read("0000:4c:00.0", with_now=True) or [{}, {}]
    # Below the loop nothing can be read; the root port above it can.
    assert [own[k] for k in ("up_gen_max", "down_gen_max", "gen", "width")] == [None] * 4
    assert [uplink[k] for k in ("up_gen_max", "down_gen_max", "gen")] == [5, None, 5]
    assert paths.read("0000:5d:00.0") is None and paths.read("0000:9b:00.0") is None
    assert _node(nvml, tmp_path) == []


def test_gpus_under_a_gen4_root_port_are_configuration_and_a_fleet_difference(
        tmp_path: Path) -> None:
    """Real-derived: four copies of the real HGX H100; on gpu002 root port 0000:15:01.0
    supports only Gen4 (its LnkCap rewritten, and its link to the switch trained at
    Gen4, as it would). Nothing there is a fault (the link is at what both ends
    support); the node says GPU 0 and the ConnectX-7 beside it cannot reach their own
    maximum, and the fleet names the odd node."""
    from tuimon_core.protocol.messages import GpuInfo, Hello

    hellos = {}
    for n in range(4):
        root = tmp_path / f"gpu{n:03d}"
        nvml, rows = _hgx(root)
        if n == 2:
            port = root / "sys/devices/pci0000:15/0000:15:01.0"
            for rel in ("max_link_speed", "current_link_speed",
                        "0000:16:00.0/current_link_speed"):
                write(port / rel, "16.0 GT/s PCIe\n")
            assert _node(nvml, root) == [
                "pcie_slot_limited: node-a GPU 0 PCIe path: root port 0000:15:01.0 supports "
                "Gen4 x16, GPU 0 Gen5 x16: it cannot reach its own maximum (also behind it: "
                "mlx5_0)"]
        paths = pci.PciPaths(FileTree(root))
        gpus = [GpuInfo(i, None, "NVIDIA H100 80GB HBM3", None, None, a, None, None,
                        pcie_path=paths.read(a))
                for i, a in enumerate(a for a, r in rows.items() if r[1] == "3D controller")]
        hellos[f"gpu{n:03d}"] = Hello(f"gpu{n:03d}", "0", None, 1.0, 0.0, gpus=gpus)
    assert [f.message for f in fleet_findings(hellos)] == [
        "PCIe path (NVIDIA H100 80GB HBM3): Gen4 x16 on gpu002 (1 node); Gen5 x16 on 3"]


def test_path_rules_on_the_wire_alone() -> None:
    """What a viewer judges for an agent that does not judge itself: an HCA's link above
    its own (no GPU behind it) is judged always; a GPU's links only from a sample that
    matches its hello's path; unknown ends judge nothing."""
    from tuimon_core.link_rules import LinkRules
    from tuimon_core.protocol.messages import GpuInfo, Hello

    own = {"up": "0000:03:00.0", "down": "0000:04:00.0", "up_kind": "switch", "up_gen_max": 5,
           "up_width_max": 16, "down_gen_max": 5, "down_width_max": 16, "gen": 5,
           "width": 16}
    uplink = {**own, "up": "0000:01:00.0", "down": "0000:02:00.0", "up_kind": "root",
              "gen": 5, "width": 8}
    port = {"id": "mlx5_0:1", "device": "mlx5_0", "pcie_gen": 5, "pcie_width": 16,
            "pcie_gen_max": 5, "pcie_width_max": 16, "pcie_path": [own, uplink]}
    gpu = GpuInfo(0, None, "H100", None, None, "0000:05:00.0", None, None, pcie_gen_max=5,
                  pcie_width_max=16, pcie_path=[{**own, "down": "0000:05:00.0"},
                                                {**uplink, "up": "0000:07:00.0"}])

    def judged(gen: list[object], up_max: object = 5) -> list[str]:
        gpu.pcie_path[1]["up_gen_max"] = up_max  # type: ignore[index]
        hello = Hello("n", "0", None, 1.0, 0.0, gpus=[gpu], extra={"ports": [port]})
        sample = Sample(1, 0.0, 1.0, gpus=[{"util": 0.9, "pcie_gen": 5, "pcie_width": 16,
                                            "pcie_path_gen": gen,
                                            "pcie_path_width": [16] * len(gen)}])
        return [f.message for f in LinkRules("n").conditions(hello, sample, 0.0)]
    hca = "n mlx5_0 PCIe path: root port 0000:01:00.0 -> 0000:02:00.0 at Gen5 x8 of Gen5 x16"
    assert judged([5, 4]) == ["n GPU 0 PCIe path: root port 0000:07:00.0 -> 0000:02:00.0 "
                              "at Gen4 x16 of Gen5 x16 while busy", hca]
    assert judged([5, None]) == judged([5, 4, 4]) == judged([5, 4], up_max=None) == [hca]
