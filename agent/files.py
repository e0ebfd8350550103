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
# A first read's size: a sysfs attribute is at most a page; /proc files grow past it
# (a big machine's /proc/stat, a container host's mounts) and are read on in chunks.
READ_CHUNK = 4096
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
        # The file each kept descriptor was opened on (device, inode), to tell a path
        # that now names another file (`revalidate`).
        self._opened: dict[str, tuple[int, int]] = {}
        self._sizes: dict[str, int] = {}  # the last size of each kept whole file

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def _full(self, rel: str) -> str:
        # Plain strings, not pathlib: this runs for every file on every sample.
        return os.path.join(self._root, rel.lstrip("/"))

    def _open(self, rel: str) -> int:
        try:
            return os.open(self._full(rel), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ReadError(rel, MISSING) from None
        except PermissionError:
            raise ReadError(rel, "permission denied") from None
        except OSError as exc:
            raise ReadError(rel, exc.strerror or type(exc).__name__) from None

    def _read_all(self, rel: str, fd: int, first: int) -> bytes:
        """The whole file from offset 0, read until a read returns nothing: procfs hands
        out a file a page of records at a time (a short read is not its end: a host's
        mount table, mountstats, diskstats with many devices), so a file that fits one
        read costs one more, empty, read. `first`: the size asked for at first."""
        parts = []
        size = 0
        ask = max(READ_CHUNK, first)
        try:
            while True:
                more = os.pread(fd, ask, size)
                if not more:
                    break
                parts.append(more)
                size += len(more)
                if size > MAX_FILE_BYTES:
                    raise ReadError(rel, f"larger than {MAX_FILE_BYTES} bytes")
        except OSError as exc:  # EISDIR, EIO, ENODEV from a device going away
            if isinstance(exc, ReadError):
                raise
            raise ReadError(rel, exc.strerror or type(exc).__name__) from None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_text(self, rel: str) -> str:
        """A file read once or seldom (firmware, a process's status): opened and closed."""
        fd = self._open(rel)
        try:
            return self._read_all(rel, fd, READ_CHUNK).decode("utf-8", errors="replace")
        finally:
            os.close(fd)

    def read_often(self, rel: str) -> str:
        """A whole file read on every sample (/proc/stat, diskstats, mounts, a client's
        statistics), through a kept descriptor like `read_counter`; its first read asks
        for the size it had last time."""
        fd = self._fds.get(rel)
        if fd is not None:
            try:
                data = self._read_all(rel, fd, self._sizes.get(rel, 0) + READ_CHUNK)
            except ReadError:
                self._drop(rel)
            else:
                self._sizes[rel] = len(data)
                return data.decode("utf-8", errors="replace")
        fd = self._open(rel)
        try:
            data = self._read_all(rel, fd, READ_CHUNK)
        except ReadError:
            os.close(fd)
            raise
        if self._keep(rel, fd):
            self._sizes[rel] = len(data)
        return data.decode("utf-8", errors="replace")

    def _keep(self, rel: str, fd: int) -> bool:
        """Keep `fd` for `rel` (closed instead when the cache is full); True if kept."""
        if len(self._fds) >= MAX_CACHED_FDS:
            os.close(fd)
            return False
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return False
        self._fds[rel] = fd
        self._opened[rel] = (st.st_dev, st.st_ino)
        return True

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
        self._keep(rel, fd)
        return data

    def forget(self, prefix: str) -> None:
        """Close cached descriptors under `prefix` (a device that went away)."""
        for rel in [r for r in self._fds if r.startswith(prefix)]:
            self._drop(rel)

    def revalidate(self) -> int:
        """Close each kept descriptor whose path no longer names the file it was opened
        on (removed, or replaced by a rename), so the next read opens it afresh; returns
        how many. A device that goes away fails its reads at once (sysfs answers ENODEV);
        a regular file that is replaced or removed does not, and is noticed here, on the
        agent's slow cadence: one stat a file, not an open and close a file a sample."""
        stale = []
        for rel, opened in self._opened.items():
            try:
                st = os.stat(self._full(rel))
            except (OSError, ValueError):
                stale.append(rel)
                continue
            if (st.st_dev, st.st_ino) != opened:
                stale.append(rel)
        for rel in stale:
            self._drop(rel)
        return len(stale)

    def close(self) -> None:
        for rel in list(self._fds):
            self._drop(rel)

    def _drop(self, rel: str) -> None:
        self._opened.pop(rel, None)
        self._sizes.pop(rel, None)
        fd = self._fds.pop(rel, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self._full(rel)))
        except FileNotFoundError:
            raise ReadError(rel, MISSING) from None
        except PermissionError:
            raise ReadError(rel, "permission denied") from None
        except OSError as exc:
            raise ReadError(rel, exc.strerror or type(exc).__name__) from None

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._full(rel))  # False for a NUL in a name, too

    def link_target(self, rel: str) -> str | None:
        """Where a symlink points, as written (sysfs writes relative paths), None if it is
        not a symlink or cannot be read."""
        try:
            return os.readlink(self._full(rel))
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
    read_often = read_text

    def close(self) -> None:
        pass

    def revalidate(self) -> int:
        return 0

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
