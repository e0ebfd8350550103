"""XID and ECC events from an NVML event set, waited on in a thread of their own.

nvmlEventSetWait blocks; it gets its own daemon thread so that the event loop, the
sampler and every stream stay free. Each event is handed to the loop with
`call_soon_threadsafe` and reaches stream clients within the wait timeout.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.collectors.gpu import GpuCollector, _text
from tuimon_core import xids
from tuimon_core.protocol.messages import Event

log = logging.getLogger(__name__)

EV_SINGLE_BIT_ECC = 0x1
EV_DOUBLE_BIT_ECC = 0x2
EV_XID = 0x8
TIMEOUT_CODE = 10  # NVML_ERROR_TIMEOUT
# How long one wait blocks. Events return at once; the timeout only bounds how long
# stop() takes. Each timeout wakes a thread, which costs CPU on a node: keep it long.
DEFAULT_WAIT_S = 2.0

class XidWatcher:
    """Owns the NVML event set and the thread that waits on it."""

    def __init__(self, collector: GpuCollector, deliver: Callable[[Event], None],
                 wait_s: float = DEFAULT_WAIT_S) -> None:
        self.collector = collector
        self.wait_ms = max(10, int(wait_s * 1000))
        self.deliver = deliver
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None
        self.status: str | None = None

    def start(self) -> bool:
        nvml = self.collector.nvml
        if nvml is None or not self.collector.handles:
            self.status = "no GPUs to watch"
            return False
        try:
            self._set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            self.status = f"NVML event set unavailable: {_text(exc)}"
            return False
        registered = 0
        for h in self.collector.handles:
            if h is None:
                continue
            for mask in (EV_XID | EV_DOUBLE_BIT_ECC | EV_SINGLE_BIT_ECC, EV_XID):
                try:
                    nvml.nvmlDeviceRegisterEvents(h, mask, self._set)
                    registered += 1
                    break
                except nvml.NVMLError:
                    continue
        if not registered:
            self.status = "no GPU supports XID events"
            return False
        self._thread = threading.Thread(target=self._run, name="tuimon-xid", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_ms / 1000 + 1)
            if self._thread.is_alive():
                # Still inside nvmlEventSetWait: freeing the set under it is not safe.
                log.warning("XID thread did not stop; leaving its event set to NVML shutdown")
                return
        nvml = self.collector.nvml
        if self._set is not None and nvml is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(self._set)
            self._set = None

    def _run(self) -> None:
        nvml = self.collector.nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        failures = 0
        while not self._stop.is_set():
            try:
                data = wait(self._set, self.wait_ms)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == TIMEOUT_CODE:
                    failures = 0
                    continue
                failures += 1
                log.warning("NVML event wait failed: %s", _text(exc))
                # Back off rather than spin if the driver keeps failing.
                self._stop.wait(min(30.0, 0.5 * 2**failures))
                continue
            event = self._to_event(data)
            if event is not None:
                self.deliver(event)

    def _to_event(self, data: Any) -> Event | None:
        index = self.collector.handle_index(data.device)
        kind = int(data.eventType)
        now = time.time()
        if kind & EV_XID:
            code = int(data.eventData)
            if index is not None:
                self.collector.note_xid(index, code)
            where = f"GPU {index}" if index is not None else "a GPU"
            return Event(now, "xid", xids.severity(code),
                         f"XID {code} on {where}: {xids.describe(code)}",
                         gpu=index, code=code, source="gpu")
        if kind & EV_DOUBLE_BIT_ECC:
            return Event(now, "ecc", "critical", f"double-bit ECC error on GPU {index}",
                         gpu=index, source="gpu")
        if kind & EV_SINGLE_BIT_ECC:
            return Event(now, "ecc", "warning", f"single-bit ECC error on GPU {index}",
                         gpu=index, source="gpu")
        return None
