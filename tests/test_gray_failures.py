"""Why a node is slow, on data we did not write: real servers' PCI links, NVLink states,
InfiniBand inventories and nvidia-smi reports run through the agent's readers and the
link and fleet rules. A healthy real machine judged faulty is a bug like any other."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.collectors import pci
from agent.collectors.platform import PlatformReader, loaded_modules
from agent.files import FileTree
from agent.findings import NodeFindings
from agent.sim.fake_nvml import FakeGpu, FakeNvml
from tests.conftest import make_agent
from tests.trees import write
from tuimon_core.fleet import fleet_findings, fleet_table
from tuimon_core.link_rules import allowed_replays
from tuimon_core.protocol import Sample

REAL = Path(__file__).resolve().parent / "fixtures" / "real"
CLASSES = {"3D controller": "0x030200", "VGA compatible controller": "0x030000",
           "Bridge": "0x068000", "PCI bridge": "0x060400", "Ethernet controller": "0x020000",
           "Infiniband controller": "0x020700"}


def lspci_rows(name: str) -> list[list[str]]:
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
    rows = lspci_rows(name)
    for address, cls, device, *link in rows:
        pci_device(root, root / "sys/bus/pci/devices" / address, cls, device, *link)
    return rows


def pci_paths_tree(root: Path, name: str) -> dict[str, list[str]]:
    """A real server's PCI tree (`pci_*_paths.txt`) as the kernel lays it out: each
    device's directory inside its upstream bridge's, under /sys/devices/pciDDDD:BB, and
    /sys/bus/pci/devices/<address> a relative symlink to it."""
    rows = {r[0]: r for r in lspci_rows(name)}
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
    rules hold after `seconds` of samples."""
    import asyncio

    clock = [1000.0]
    agent = make_agent(root, nvml, interval=1.0, watch_xid=False)
    agent._monotonic = lambda: clock[0]  # type: ignore[method-assign]
    agent.findings = NodeFindings("node-a", lambda: clock[0])

    async def run() -> list[str]:
        await agent.start(sampling=False)
        try:
            for second in range(seconds):
                clock[0] += 1.0
                if tick is not None:
                    tick(second)
                await agent.sample_once()
            return [f"{f.kind}: {f.message}" for f in agent.findings.active]
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
    rows = lspci_rows("pci_asus_rtx6000ada_lspci.txt")
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
    addresses = [r[0] for r in lspci_rows("pci_hgx_h100_lspci.txt") if r[1] == "3D controller"]
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


def test_a_fleet_of_real_hgx_nodes_names_the_port_below_rate_not_the_bluefield(
        tmp_path: Path) -> None:
    """Four nodes with a real HGX H100's HCAs (eight ConnectX-7 at 400 Gb/s, a BlueField-3
    at 200 on Ethernet): the BlueField is another model, not a slow port. One node whose
    mlx5_4 came up at 200 Gb/s and another on older firmware are named; nothing else."""
    from agent.collectors.fabric import FabricCollector
    from tuimon_core.protocol.messages import Hello

    rows = [[c.strip() for c in line.split("|")] for line in
            (REAL / "infiniband_hgx_h100.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    hellos = {}
    for n in range(4):
        root = tmp_path / f"node{n}"
        for device, hca, board, fw, rate, layer, state, phys in rows:
            if n == 2 and device == "mlx5_4":
                rate = "200 Gb/sec (4X HDR)"
            if n == 3:
                fw = "28.39.1002" if hca == "MT4129" else fw
            dev = root / "sys/class/infiniband" / device
            for key, value in (("hca_type", hca), ("board_id", board), ("fw_ver", fw)):
                write(dev / key, value)  # gpud's files have no newline: both are read
            for key, value in (("rate", rate), ("link_layer", layer), ("state", state),
                               ("phys_state", phys)):
                write(dev / "ports/1" / key, value + "\n")
        fabric = FabricCollector(FileTree(root))
        fabric.collect(0.0)
        hellos[f"gpu{n:03d}"] = Hello(f"gpu{n:03d}", "0", None, 1.0, 0.0,
                                      extra=fabric.inventory())
    found = sorted(f.message for f in fleet_findings(hellos))
    assert found == ["HCA firmware (MT4129): 28.39.1002 on gpu003 (1 node); 28.41.1000 on 3",
                     "port rate (MT4129): 200 Gb/s on gpu002 (1 node); 400 Gb/s on 3"], found
    table = {(a.key, m): groups for a, m, groups in fleet_table(hellos)}
    assert [g.value for g in table[("port_rate", "MT41692")]] == [25e9]  # 200 Gb/s, all four


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


def test_a_roce_port_that_pauses_its_peer_is_named(tmp_path: Path) -> None:
    """A RoCE port whose netdev's driver statistics (the counter names of a real
    ConnectX-4 Lx: global pause, durations in microseconds) say it held its peer off 30 %
    of each second: its share is on the wire, and the node names it; a netdev whose
    statistics cannot be read says why, and the rest of the port is read."""
    from agent.collectors.fabric import FabricCollector
    from tests.trees import ib_port
    from tuimon_core.node_rules import NodeRules

    ib_port(tmp_path, "mlx5_0", link_layer="Ethernet", netdev="ens1f0np0")
    ib_port(tmp_path, "mlx5_1", link_layer="Ethernet", netdev="ens1f1np1")
    counters = {"tx_global_pause": 1266552, "tx_global_pause_duration": 555665182,
                "rx_discards_phy": 0, "tx_pause_storm_warning_events": 0,
                "tx_pause_storm_error_events": 0}

    class Driver:
        def read(self, ifname: str) -> dict[str, int]:
            if ifname == "ens1f1np1":
                raise OSError(95, "ens1f1np1: EOPNOTSUPP: the driver has no statistics")
            return dict(counters)

        def close(self) -> None:
            pass
    fabric = FabricCollector(FileTree(tmp_path), ethtool=Driver())
    rules = NodeRules("roce01")
    book = []
    for second in range(15):
        counters["tx_global_pause_duration"] += 300_000  # 0.3 s of each second
        counters["tx_global_pause"] += 6000
        values, _ = fabric.collect(float(second))
        rules.observe(None, Sample(second + 1, 0.0, 1.0, gpus=[],
                                   extra={"fabric": values}), float(second))
        book = rules.conditions(float(second))
    ports = {p["id"]: p for p in values["ports"]}
    assert ports["mlx5_0:1"]["paused_tx"] == pytest.approx(0.3)
    assert ports["mlx5_0:1"]["pause_tx_s"] == pytest.approx(6000)
    assert "EOPNOTSUPP" in ports["mlx5_1:1"]["counter_errors"]["ethtool"]
    assert ports["mlx5_1:1"]["tx_bytes_s"] is not None
    assert [f.message for f in book if f.kind == "pfc_pausing"] == [
        "roce01 mlx5_0:1 holds its peer off 30% of the time (PFC)"]


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
