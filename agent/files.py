"""Reading the machine's /proc and /sys files, under a root prefix, with bounded size.

Collectors read through a `FileTree` so the agent can run in a container that mounts
the host under /host (`--root /host`), tests can point it at a temporary tree, and the
simulator can hand it generated contents: only this lowest layer differs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

MAX_FILE_BYTES = 1 << 20
MAX_CACHED_FDS = 2048
# The reason of a file that is not there (this hardware or driver has none), unlike one
# that is there and cannot be read.
MISSING = "missing"


class ReadError(OSError):
    """A file could not be read; `reason` is short enough to show beside the value."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class FileTree:
    """The real file system, every absolute path taken relative to `root`."""

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root)
        self._root = os.fspath(root)
        self._fds: dict[str, int] = {}

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def _open(self, rel: str) -> int:
        # Plain strings, not pathlib: this runs for every file on every sample.
        try:
            return os.open(os.path.join(self._root, rel.lstrip("/")), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ReadError(rel, MISSING) from None
        except PermissionError:
            raise ReadError(rel, "permission denied") from None
        except OSError as exc:
            raise ReadError(rel, exc.strerror or type(exc).__name__) from None

    def read_text(self, rel: str) -> str:
        fd = self._open(rel)
        try:
            with open(fd, "rb", closefd=True) as fh:
                data = fh.read(MAX_FILE_BYTES + 1)
        except OSError as exc:  # EISDIR, EIO, ENODEV from a device going away
            raise ReadError(rel, exc.strerror or type(exc).__name__) from None
        if len(data) > MAX_FILE_BYTES:
            raise ReadError(rel, f"larger than {MAX_FILE_BYTES} bytes")
        return data.decode("utf-8", errors="replace")

    def read_counter(self, rel: str) -> bytes | str:
        """Read a small, often-read file (a sysfs counter) through a cached descriptor.

        sysfs and procfs regenerate a file's contents on every read at offset 0, so a
        kept descriptor and one pread replace open, read and close on every sample: a
        node with 8 HCA ports reads a few hundred such files a second. Returns raw bytes
        (`int()` takes them as they are). A device that goes away fails the pread
        (ENODEV) and the file is opened afresh next time; collectors also `forget` the
        descriptors of devices that disappear from their directory.
        """
        fd = self._fds.get(rel)
        if fd is not None:
            try:
                return os.pread(fd, 4096, 0)
            except OSError:
                self._drop(rel)
        fd = self._open(rel)
        try:
            data = os.pread(fd, 4096, 0)
        except OSError as exc:
            os.close(fd)
            raise ReadError(rel, exc.strerror or type(exc).__name__) from None
        if len(self._fds) < MAX_CACHED_FDS:
            self._fds[rel] = fd
        else:
            os.close(fd)
        return data

    def forget(self, prefix: str) -> None:
        """Close cached descriptors under `prefix` (a device that went away)."""
        for rel in [r for r in self._fds if r.startswith(prefix)]:
            self._drop(rel)

    def close(self) -> None:
        for rel in list(self._fds):
            self._drop(rel)

    def _drop(self, rel: str) -> None:
        fd = self._fds.pop(rel, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except FileNotFoundError:
            raise ReadError(rel, MISSING) from None
        except PermissionError:
            raise ReadError(rel, "permission denied") from None
        except OSError as exc:
            raise ReadError(rel, exc.strerror or type(exc).__name__) from None

    def exists(self, rel: str) -> bool:
        return self.path(rel).exists()

    def link_target(self, rel: str) -> str | None:
        """Where a symlink points, as written (sysfs writes relative paths), None if it is
        not a symlink or cannot be read."""
        try:
            return os.readlink(self.path(rel))
        except (OSError, ValueError):  # ValueError: a NUL in a name built from input
            return None

    def link_name(self, rel: str) -> str | None:
        """The last part of where a symlink points (a device's `driver`), None if none."""
        target = self.link_target(rel)
        return os.path.basename(target.rstrip("/")) or None if target else None


class GeneratedTree(FileTree):
    """Files whose contents a function makes on each read (the simulator's machines)."""

    def __init__(self, files: dict[str, Callable[[], str]]) -> None:
        super().__init__("/")
        self.files = {k.strip("/"): v for k, v in files.items()}
        # Directory index, built once: listdir is called for every device every sample.
        self._dirs: dict[str, set[str]] = {}
        for key in self.files:
            parts = key.split("/")
            for i in range(1, len(parts)):
                self._dirs.setdefault("/".join(parts[:i]), set()).add(parts[i])

    def read_text(self, rel: str) -> str:
        make = self.files.get(rel.lstrip("/"))
        if make is None:
            raise ReadError(rel, MISSING)
        return make()

    read_counter = read_text

    def close(self) -> None:
        pass

    def listdir(self, rel: str) -> list[str]:
        names = self._dirs.get(rel.strip("/"))
        if names is None:
            raise ReadError(rel, MISSING)
        return sorted(names)

    def exists(self, rel: str) -> bool:
        key = rel.strip("/")
        return key in self.files or key in self._dirs

    def link_target(self, rel: str) -> str | None:
        """A generated symlink is a file whose content is its target (a name, or a path
        as sysfs writes one)."""
        make = self.files.get(rel.strip("/"))
        return make().strip() if make is not None else None
