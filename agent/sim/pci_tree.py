"""A simulated HGX node's PCIe tree as sysfs lays it out: each GPU and its HCA behind one
Gen5 switch (as on a real HGX H100: a Broadcom PEX890xx per GPU-NIC pair), the switch
behind a root port of its own.

    /sys/devices/pci0000:15/0000:15:01.0               root port
                            /0000:16:00.0              the switch's upstream port
                            /0000:17:00.0/0000:18:00.0  downstream port, GPU 0
                            /0000:17:02.0/0000:1a:00.0  downstream port, mlx5_0

/sys/bus/pci/devices/<address> and /sys/class/infiniband/<hca>/device are symlinks into
it (a generated symlink is a file whose content is its target). The GPU's own link is
what NVML says of it (an idle GPU at Gen1); the switch's uplink is Gen5 x16 unless the
node's trouble says otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from agent.sim.fake_nvml import FakeGpu

SPEEDS = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0", 6: "64.0"}
GEN5_X16 = (5, 16)


def _speed(gen: int) -> str:
    """A generation as sysfs writes it (the kernel's pci_speed_string)."""
    return f"{SPEEDS[gen]} GT/s PCIe\n" if gen in SPEEDS else "Unknown\n"


def _end(out: dict[str, Callable[[], str]], base: str,
         now: Callable[[], tuple[int, int]], most: tuple[int, int] = GEN5_X16) -> None:
    """One end of a link: what it supports and, read when asked, its state now."""
    out[f"{base}/max_link_speed"] = lambda: _speed(most[0])
    out[f"{base}/max_link_width"] = lambda: f"{most[1]}\n"
    out[f"{base}/current_link_speed"] = lambda: _speed(now()[0])
    out[f"{base}/current_link_width"] = lambda: f"{now()[1]}\n"


def pci_tree(gpus: list[FakeGpu], hcas: int,
             uplink: Callable[[int], tuple[int, int]]) -> dict[str, Callable[[], str]]:
    """The files of the tree for GPU i at bus 0x18 + 0x10 i (FakeNvml's addresses) and
    HCA mlx5_i at 0x1a + 0x10 i; `uplink(i)`: the switch above GPU i's link to its root
    port now. Pairs whose buses would pass 0xff are left out (no bus numbers left)."""
    out: dict[str, Callable[[], str]] = {}
    for i in range(max(len(gpus), hcas)):
        bus = 0x15 + 0x10 * i
        if bus + 5 > 0xFF:
            break
        root = f"sys/devices/pci0000:{bus:02x}/0000:{bus:02x}:01.0"
        switch = f"{root}/0000:{bus + 1:02x}:00.0"
        up = functools.partial(uplink, i)
        _end(out, root, up)
        _end(out, switch, up)
        gpu = next((g for g in gpus if g.index == i), None)
        if gpu is not None:
            _device(out, f"{switch}/0000:{bus + 2:02x}:00.0", f"0000:{bus + 3:02x}:00.0",
                    functools.partial(_own, gpu))
        if i < hcas:
            address = f"0000:{bus + 5:02x}:00.0"
            _device(out, f"{switch}/0000:{bus + 2:02x}:02.0", address, lambda: GEN5_X16)
            out[f"sys/class/infiniband/mlx5_{i}/device"] = _const(f"../../../{address}")
    return out


def _device(out: dict[str, Callable[[], str]], downstream: str, address: str,
            now: Callable[[], tuple[int, int]]) -> None:
    """A switch's downstream port and the device below it (one link), and the device's
    /sys/bus/pci/devices symlink."""
    _end(out, downstream, now)
    _end(out, f"{downstream}/{address}", now)
    out[f"sys/bus/pci/devices/{address}"] = _const(
        f"../../../{downstream.removeprefix('sys/')}/{address}")


def _own(gpu: FakeGpu) -> tuple[int, int]:
    """A GPU's own link now, as NVML says it (an idle GPU lowers it)."""
    return gpu.pcie_gen, gpu.pcie_width


def _const(text: str) -> Callable[[], str]:
    return lambda: text
