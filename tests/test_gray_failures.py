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
from tests.nvidia_smi import fake_gpus, read_xml
from tests.trees import write
from tuimon_core.findings import Finding
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


def pci_tree(root: Path, name: str) -> list[list[str]]:
    """A /sys/bus/pci/devices tree with the devices, classes and links of a real
    server's `lspci -vvv`, in the format the kernel writes (pci_speed_string)."""
    rows = lspci_rows(name)
    for address, cls, device, max_speed, max_width, speed, width in rows:
        base = root / "sys/bus/pci/devices" / address
        vendor = "0x10de" if device.startswith("NVIDIA") else \
            "0x15b3" if device.startswith("Mellanox") else "0x8086"
        write(base / "vendor", vendor + "\n")
        write(base / "class", CLASSES.get(cls, "0x088000") + "\n")
        for key, value in (("max_link_speed", max_speed), ("current_link_speed", speed)):
            write(base / key, f"{float(value):.1f} GT/s PCIe\n")
        write(base / "max_link_width", max_width + "\n")
        write(base / "current_link_width", width + "\n")
        driver = root / "drivers" / ("nvidia" if vendor == "0x10de" else "mlx5_core")
        driver.mkdir(parents=True, exist_ok=True)
        os.symlink(driver, base / "driver")
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
