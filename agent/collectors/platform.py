"""What the node is made of, read rarely: the kernel release, the NVIDIA GPUs on the PCI
bus (what NVML should see), and the GPUDirect RDMA module. They go in the hello; a
change sends a new one, and the viewer compares them across the fleet."""

from __future__ import annotations

from typing import Any

from agent.collectors import pci
from agent.files import FileTree, ReadError

# Modules that let an RDMA NIC read and write GPU memory: NVIDIA's (driver 470 and
# later), and Mellanox's older out-of-tree one. NCCL and UCX look for them too.
GPUDIRECT_MODULES = ("nvidia_peermem", "nv_peer_mem")


def loaded_modules(text: str) -> set[str]:
    """The module names of /proc/modules (`name size refs deps state addr [taint]`)."""
    return {line.split(None, 1)[0] for line in text.splitlines() if line.strip()}


class PlatformReader:
    def __init__(self, files: FileTree) -> None:
        self.files = files

    def read(self) -> dict[str, Any]:
        """`kernel`, `pci_gpus` and `gpudirect` (a module's name, `none`, or None when
        the modules cannot be read)."""
        return {"kernel": self._kernel(), "pci_gpus": pci.nvidia_gpus(self.files),
                "gpudirect": self._gpudirect()}

    def _kernel(self) -> str | None:
        try:
            return self.files.read_text("proc/sys/kernel/osrelease").strip() or None
        except ReadError:
            return None

    def _gpudirect(self) -> str | None:
        try:
            modules = loaded_modules(self.files.read_text("proc/modules"))
        except ReadError:
            modules = None
        for name in GPUDIRECT_MODULES:
            # Built into the kernel, a module is in /sys/module but not /proc/modules.
            if (modules is not None and name in modules) or \
                    self.files.exists(f"sys/module/{name}"):
                return name
        return None if modules is None else "none"
