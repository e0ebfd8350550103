"""Recordings: the frames a viewer received, as received, for post-mortems and sharing.

A recording is a gzip stream of msgpack values: a header map
`{"tuimon_recording": 1, "started": unix_ts, "name": str}`, then one array per frame
`[seconds since start, target, frame bytes]`. Frames are kept exactly as they arrived,
so a replay decodes them with the same code and sees what the viewer saw. The writer
flushes every second: a crash loses at most the last second.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from tuimon.model.cluster import ClusterState
from tuimon_core.errors import UsageError
from tuimon_core.protocol import Batch, ProtocolError, Subscribe, decode

FORMAT_VERSION = 1
MAX_FRAME = 16 << 20


class RecordingError(UsageError, ValueError):
    """A file that is not a tuimon recording, or is damaged; the message says where."""


class RecordingWriter:
    def __init__(self, path: str | Path, name: str = "cluster") -> None:
        self.path = Path(path)
        try:
            # Open for the life of the recorder, closed by close(): not a with block.
            self._fh = gzip.open(self.path, "wb", compresslevel=6)  # noqa: SIM115
        except OSError as exc:
            raise RecordingError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self.started = time.time()
        self._t0 = time.monotonic()
        self._last_flush = self._t0
        self.frames = 0
        self._fh.write(msgpack.packb({"tuimon_recording": FORMAT_VERSION,
                                      "started": self.started, "name": name}))

    def write(self, target: str, data: bytes) -> None:
        now = time.monotonic()
        self._fh.write(msgpack.packb([now - self._t0, target, data], use_bin_type=True))
        self.frames += 1
        if now - self._last_flush >= 1.0:
            self._fh.flush()
            self._last_flush = now

    def close(self) -> None:
        self._fh.close()


@dataclass
class Recording:
    started: float
    name: str
    frames: list[tuple[float, str, bytes]] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.frames[-1][0] if self.frames else 0.0


def read_recording(path: str | Path) -> Recording:
    """Load a whole recording; a damaged tail keeps the frames before it."""
    try:
        with gzip.open(Path(path), "rb") as fh:
            unpacker = msgpack.Unpacker(fh, raw=False, max_buffer_size=MAX_FRAME * 2,
                                        max_bin_len=MAX_FRAME, max_str_len=1 << 16)
            try:
                header = next(unpacker)
            except StopIteration:
                raise RecordingError(f"{path}: empty") from None
            if not isinstance(header, dict) or \
                    header.get("tuimon_recording") != FORMAT_VERSION:
                raise RecordingError(f"{path}: not a tuimon recording (no version "
                                     f"{FORMAT_VERSION} header)")
            rec = Recording(float(header.get("started") or 0.0), str(header.get("name") or ""))
            try:
                for item in _frames(unpacker):
                    rec.frames.append(item)
            except (OSError, EOFError, ValueError, msgpack.UnpackException):
                pass  # cut short (the recorder was killed): keep what is whole
    except RecordingError:
        raise
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file") from None
    except PermissionError:
        raise RecordingError(f"{path}: permission denied") from None
    except (OSError, EOFError, ValueError, msgpack.UnpackException) as exc:
        raise RecordingError(f"{path}: not a tuimon recording ({exc})") from None
    return rec


def _frames(unpacker: msgpack.Unpacker) -> Iterator[tuple[float, str, bytes]]:
    for item in unpacker:
        if (isinstance(item, list) and len(item) == 3 and isinstance(item[0], (int, float))
                and isinstance(item[1], str) and isinstance(item[2], bytes)):
            yield float(item[0]), item[1], item[2]


@dataclass
class ReplayControl:
    """Shared between the replay task and the app: pause, step and seek."""

    speed: float = 1.0
    paused: bool = False
    position: float = 0.0  # seconds into the recording
    seek_to: float | None = None
    step_once: bool = False


def apply_frame(cluster: ClusterState, target: str, data: bytes) -> None:
    try:
        message = decode(data)
    except ProtocolError as exc:
        cluster.note_protocol_error(target, exc.reason)
        return
    if not isinstance(message, (Subscribe, Batch)):
        cluster.apply_message(target, message, data)


async def replay(rec: Recording, cluster: ClusterState, control: ReplayControl) -> None:
    """Feed the recording into the model at its pace (times `speed`), obeying `control`."""
    i = 0
    while True:
        if control.seek_to is not None:
            target = max(0.0, min(rec.duration, control.seek_to))
            control.seek_to = None
            if target < control.position:  # backwards: rebuild from the start
                cluster.clear()
                i = 0
            while i < len(rec.frames) and rec.frames[i][0] <= target:
                apply_frame(cluster, rec.frames[i][1], rec.frames[i][2])
                i += 1
            control.position = target
            cluster.version += 1
        if i >= len(rec.frames):
            control.paused = True  # the end: stay on the last picture
            await asyncio.sleep(0.1)
            continue
        if control.paused and not control.step_once:
            await asyncio.sleep(0.05)
            continue
        t, target_name, data = rec.frames[i]
        if control.step_once:
            control.step_once = False
            control.seek_to = control.position + 1.0
            continue
        wait = (t - control.position) / max(control.speed, 1e-6)
        if wait > 0:
            await asyncio.sleep(min(wait, 0.1))
            control.position += min(wait, 0.1) * control.speed
            continue
        apply_frame(cluster, target_name, data)
        control.position = max(control.position, t)
        i += 1
