"""Recordings: the frames a viewer received, as received, for post-mortems and sharing.

A recording is a gzip stream of msgpack values: a header map
`{"tuimon_recording": 1, "started": unix_ts, "name": str}`, then one array per frame
`[seconds since start, target, frame bytes]`. Frames are kept exactly as they arrived,
so a replay decodes them with the same code and sees what the viewer saw. What the
viewer learned without a frame (a node lost, a relay unreachable, a relay's node states
and the run's budget) is kept as `[seconds, method, msgpack of its arguments, 0]`: the
model call the source made (`SINK_CALLS`), checked and made again by the replay, so an
outage plays as it happened live. Readers that predate these four-item entries skip
them. The writer flushes every second: a crash loses at most the last second.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from tuimon.model.cluster import ClusterState
from tuimon.model.view_state import ReplayControl  # the model's: the player sets it
from tuimon_core.errors import UsageError
from tuimon_core.node_states import STATES
from tuimon_core.protocol import MAX_MESSAGE_BYTES, Batch, ProtocolError, Subscribe, decode
from tuimon_core.protocol.fields import BUDGET, JUDGEMENT, MAX_STR
from tuimon_core.protocol.schema import ListOf, MapOf, Str
from tuimon_core.protocol.text import clean

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# A recorded frame is one node's (a viewer records each node's frames, not batches).
MAX_ITEM = MAX_MESSAGE_BYTES + (64 << 10)


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
        self._put([time.monotonic() - self._t0, target, data])
        self.frames += 1

    def call(self, method: str, *args: Any) -> None:
        """A model call a source made besides a frame (ClusterState.recorder)."""
        if method in SINK_CALLS:
            self._put([time.monotonic() - self._t0, method,
                       msgpack.packb(list(args), use_bin_type=True), 0])

    def _put(self, item: list[Any]) -> None:
        self._fh.write(msgpack.packb(item, use_bin_type=True))
        now = time.monotonic()
        if now - self._last_flush >= 1.0:
            self._fh.flush()
            self._last_flush = now

    def close(self) -> None:
        self._fh.close()


@dataclass
class Recording:
    """A recording as read once from start to end: what it holds and where it stops. The
    frames are read again from the file as a replay plays them (`frames()`), never held
    all at once: an hour of a large cluster is gigabytes, and a small gzip can inflate
    to any size."""

    path: Path
    started: float
    name: str
    duration: float = 0.0
    count: int = 0
    # Why the frames stop before the file's end (cut short, damaged), with where.
    damage: str | None = None

    def frames(self) -> Iterator[tuple[float, str, bytes, bool]]:
        """(seconds since the start, target or method, frame or arguments' bytes, whether
        it is a model call), read from the file in order, as many as the first read
        found whole."""
        with gzip.open(self.path, "rb") as fh:
            unpacker = _unpacker(fh)
            next(unpacker)  # the header, checked by read_recording
            # No further than the whole frames read found: what follows is the damage.
            yield from itertools.islice(_frames(unpacker), self.count)


def _unpacker(fh: Any) -> msgpack.Unpacker:
    # Bounded per item, so a frame of any claimed size is refused at its header, before
    # it is inflated: a node's frame is at most MAX_MESSAGE_BYTES (a little slack).
    return msgpack.Unpacker(fh, raw=False, max_buffer_size=MAX_ITEM * 2,
                            max_bin_len=MAX_ITEM, max_str_len=1 << 16,
                            max_array_len=16, max_map_len=64)


def read_recording(path: str | Path) -> Recording:
    """Read a recording through once (constant memory): its header, how many frames and
    how long, and where a damaged or cut file stops (`damage`: the frames before it
    play)."""
    path = Path(path)
    try:
        with gzip.open(path, "rb") as fh:
            unpacker = _unpacker(fh)
            try:
                header = next(unpacker)
            except StopIteration:
                raise RecordingError(f"{path}: empty") from None
            if not isinstance(header, dict) or \
                    header.get("tuimon_recording") != FORMAT_VERSION:
                raise RecordingError(f"{path}: not a tuimon recording (no version "
                                     f"{FORMAT_VERSION} header)")
            started = header.get("started")
            rec = Recording(path, float(started) if isinstance(started, (int, float)) and
                            not isinstance(started, bool) and 0 <= started < 1e11 else 0.0,
                            clean(str(header.get("name") or ""))[:255])
            try:
                for t, _, _data, _ in _frames(unpacker):
                    rec.count += 1
                    rec.duration = max(rec.duration, t)
                if fh.tell() > unpacker.tell():  # bytes left that make no whole frame
                    raise EOFError(f"the last {fh.tell() - unpacker.tell()} bytes are a "
                                   "frame cut short")
            except (OSError, EOFError, ValueError, msgpack.UnpackException) as exc:
                # Cut short (the recorder was killed) or damaged: keep what is whole.
                rec.damage = clean(f"stops after {rec.count} frames ({rec.duration:.0f} s "
                                   f"in): {exc or type(exc).__name__}")[:300]
    except RecordingError:
        raise
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file") from None
    except PermissionError:
        raise RecordingError(f"{path}: permission denied") from None
    except (OSError, EOFError, ValueError, msgpack.UnpackException) as exc:
        raise RecordingError(f"{path}: not a tuimon recording ({exc})") from None
    return rec


def _frames(unpacker: msgpack.Unpacker) -> Iterator[tuple[float, str, bytes, bool]]:
    for item in unpacker:
        if (isinstance(item, list) and len(item) in (3, 4)
                and isinstance(item[0], (int, float)) and not isinstance(item[0], bool)
                and isinstance(item[1], str) and isinstance(item[2], bytes)
                and 0 <= item[0] < 1e9):
            call = len(item) == 4
            if call and item[1] not in SINK_CALLS:
                continue  # a call a newer writer knows: skipped, as older readers skip all
            yield float(item[0]), item[1], item[2], call


# The model calls a recording keeps, with the check of their arguments (a recording is
# a file from anyone: each argument is bounded and cleaned as the wire's are).
_TEXT = Str(MAX_STR)
_NAMES = ListOf(_TEXT, 100_000)
SINK_CALLS: dict[str, tuple[Any, ...]] = {
    "mark_stale": (_TEXT, _TEXT),
    "mark_current": (_NAMES,),
    "apply_source_state": (_TEXT, Str(choices=STATES), None),
    "relay_lost": (_TEXT, _NAMES, _TEXT),
    "relay_back": (_TEXT,),
    "source_lost": (_TEXT, _TEXT),
    "source_back": (_TEXT,),
    "forget_relay_problems": (_TEXT,),
    "forget_target": (_TEXT,),
    "note_relay_problem": (_TEXT, _TEXT, None),
    "note_source_limit": (_TEXT, None),
    "apply_judgement": (JUDGEMENT, _TEXT),
    "apply_budget": (BUDGET, _TEXT),
    "set_scrape_failures": (MapOf(ListOf(_TEXT, 2), 100_000),),
}


def _checked_call(method: str, raw: bytes) -> list[Any]:
    """The arguments of a recorded call, each checked by its type (None: a string or
    nil); a call that does not check raises ProtocolError naming the argument."""
    try:
        args = msgpack.unpackb(raw, raw=False, max_bin_len=0, max_ext_len=0)
    except Exception as exc:
        raise ProtocolError(f"recorded {method}: not msgpack ({exc})") from None
    types = SINK_CALLS[method]
    if not isinstance(args, list) or len(args) != len(types):
        raise ProtocolError(f"recorded {method}: expected {len(types)} arguments")
    out = []
    for i, (kind, value) in enumerate(zip(types, args)):
        where = f"recorded {method} argument {i + 1}"
        if kind is None:
            out.append(None if value is None else _TEXT.check(value, where))
        else:
            out.append(kind.check(value, where))
    return out


def apply_call(cluster: ClusterState, method: str, raw: bytes) -> None:
    """A recorded model call, made again: one that does not check is logged and skipped
    (nothing of it reaches the model); the replay goes on."""
    try:
        args = _checked_call(method, raw)
        if method == "relay_lost":
            args[1] = frozenset(args[1])
        elif method == "set_scrape_failures":
            args[0] = {k: (v[0], v[1]) for k, v in args[0].items() if len(v) == 2}
        getattr(cluster, method)(*args)
    except ProtocolError as exc:
        log.warning("replay: skipped a recorded call: %s", exc.reason)
    except Exception as exc:
        log.error("replaying a recorded %s failed", method, exc_info=exc)


def apply_item(cluster: ClusterState, name: str, data: bytes, call: bool) -> None:
    if call:
        apply_call(cluster, name, data)
    else:
        apply_frame(cluster, name, data)


def apply_frame(cluster: ClusterState, target: str, data: bytes) -> None:
    """One recorded frame, alone: a frame that does not decode is that node's refusal,
    and one that fails to apply (a bug) that node's internal error; the replay goes on."""
    try:
        message = decode(data)
        if not isinstance(message, (Subscribe, Batch)):
            cluster.apply_message(target, message, data)
    except ProtocolError as exc:
        cluster.note_protocol_error(target, exc.reason)
    except Exception as exc:
        log.error("replaying a frame of %s failed", target, exc_info=exc)
        cluster.mark_stale(target, clean(f"internal error: {type(exc).__name__}: {exc}")[:200])


async def replay(rec: Recording, cluster: ClusterState, control: ReplayControl) -> None:
    """Feed the recording into the model at its pace (times `speed`), obeying `control`;
    frames are read from the file as they play (seeking back reads it from the start)."""
    frames = rec.frames()
    pending = next(frames, None)
    while True:
        if control.seek_to is not None:
            target = max(0.0, min(rec.duration, control.seek_to))
            control.seek_to = None
            if target < control.position:  # backwards: rebuild from the start
                cluster.clear()
                frames = rec.frames()
                pending = next(frames, None)
            while pending is not None and pending[0] <= target:
                apply_item(cluster, *pending[1:])
                pending = next(frames, None)
            control.position = target
            cluster.version += 1
        if pending is None:
            control.paused = True  # the end: stay on the last picture
            await asyncio.sleep(0.1)
            continue
        if control.paused and not control.step_once:
            await asyncio.sleep(0.05)
            continue
        t, target_name, data, call = pending
        if control.step_once:
            control.step_once = False
            control.seek_to = control.position + 1.0
            continue
        wait = (t - control.position) / max(control.speed, 1e-6)
        if wait > 0:
            await asyncio.sleep(min(wait, 0.1))
            control.position += min(wait, 0.1) * control.speed
            continue
        apply_item(cluster, target_name, data, call)
        control.position = max(control.position, t)
        pending = next(frames, None)
