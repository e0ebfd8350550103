"""Reading the machine's /proc and /sys files, under a root prefix, with bounded size.

Collectors read through a `FileTree` so the agent can run in a container that mounts
the host under /host (`--root /host`), tests can point it at a temporary tree, and the
simulator can hand it generated contents: only this lowest layer differs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

MAX_FILE_BYTES = 1 << 20


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

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read_text(self, rel: str) -> str:
        # Plain strings, not pathlib: this runs for every file on every sample.
        p = os.path.join(self._root, rel.lstrip("/"))
        try:
            with open(p, "rb") as fh:
                data = fh.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            raise ReadError(rel, "missing") from None
        except PermissionError:
            raise ReadError(rel, "permission denied") from None
        except OSError as exc:
            raise ReadError(rel, exc.strerror or type(exc).__name__) from None
        if len(data) > MAX_FILE_BYTES:
            raise ReadError(rel, f"larger than {MAX_FILE_BYTES} bytes")
        return data.decode("utf-8", errors="replace")

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except FileNotFoundError:
            raise ReadError(rel, "missing") from None
        except PermissionError:
            raise ReadError(rel, "permission denied") from None
        except OSError as exc:
            raise ReadError(rel, exc.strerror or type(exc).__name__) from None

    def exists(self, rel: str) -> bool:
        return self.path(rel).exists()


class GeneratedTree(FileTree):
    """Files whose contents a function makes on each read (the simulator's machines)."""

    def __init__(self, files: dict[str, Callable[[], str]]) -> None:
        super().__init__("/")
        self.files = files

    def read_text(self, rel: str) -> str:
        make = self.files.get(rel.lstrip("/"))
        if make is None:
            raise ReadError(rel, "missing")
        return make()

    def listdir(self, rel: str) -> list[str]:
        prefix = rel.strip("/") + "/"
        names = {k[len(prefix):].split("/", 1)[0] for k in self.files if k.startswith(prefix)}
        if not names:
            raise ReadError(rel, "missing")
        return sorted(names)

    def exists(self, rel: str) -> bool:
        key = rel.strip("/")
        return key in self.files or any(k.startswith(key + "/") for k in self.files)
