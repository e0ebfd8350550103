"""A hostile agent, as its own process: `python -m tests.hostile_peer PORT MODE`.

- `names`: an agent whose node name, device names, port states, event messages and job
  names carry terminal escapes (OSC 0 title, OSC 52 clipboard, CSI 2J, bidi override,
  a newline that forges an output line).
- `spoof`: a target that answers with relay batches, speaking for nodes it is not,
  with a budget that would page.

It serves until killed. Tests run it beside a real viewer in a real terminal (tmux).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

from aiohttp import web

from tuimon_core.protocol import Batch, Event, Hello, Sample, encode

TITLE = "\x1b]0;pwned-title\x07"
CLIPBOARD = "\x1b]52;c;cHduZWQ=\x07"
CLEAR = "\x1b[2J\x1b[H"
EVIL = f"evil{TITLE}{CLIPBOARD}{CLEAR}\u202e"
FORGED_JOB = "train\nOK: nodes 999 up"


def names_hello() -> Hello:
    return Hello(node=EVIL, agent_version="t\x1b[31m", boot_id=None, interval=0.5, ts=time.time(),
                 extra={"ports": [{"id": f"mlx5_0:1{CLEAR}", "device": "mlx5\x07", "port": 1}],
                        "filesystems": [{"id": f"/scratch{TITLE}", "fstype": "nfs",
                                         "source": "x"}]})


def names_sample(seq: int) -> Sample:
    return Sample(seq=seq, ts=time.time(), interval=0.5,
                  gpus=[{"util": 0.5, "temp": 95.0, "failed": None,
                         "clock_events": ["hw_thermal_slowdown", f"x{TITLE}"]}],
                  host={},
                  extra={"fabric": {"ports": [{"id": f"mlx5_0:1{CLEAR}", "state": 1,
                                               "state_name": f"DOWN{CLIPBOARD}"}]},
                         "storage": {"filesystems": [{"id": f"/scratch{TITLE}", "fstype": "nfs",
                                                      "read_bytes_s": 1e9}]},
                         "steps": {"jobs": [{"id": FORGED_JOB, "world": 2, "ranks": [
                             {"rank": r, "steps": 1, "wall": 0.5, "compute": 0.2 + 0.2 * r,
                              "samples": 8} for r in range(2)]}]}})


async def names(ws: web.WebSocketResponse) -> None:
    await ws.send_bytes(encode(names_hello()))
    await ws.send_bytes(encode(Event(ts=time.time(), kind="xid", severity="critical",
                                     message=f"XID 79 on {EVIL}", gpu=0, code=79)))
    for seq in range(1, 1_000_000):
        await ws.send_bytes(encode(names_sample(seq)))
        await asyncio.sleep(0.5)


def spoof_batch(victims: list[str]) -> Batch:
    frames = []
    for v in victims:
        frames.append((v, encode(Hello(node=v.split(":")[0], agent_version="spoof",
                                       boot_id=None, interval=1.0, ts=time.time()))))
        frames.append((v, encode(Sample(seq=1, ts=time.time(), interval=1.0,
                                        gpus=[{"temp": 99.0, "util": 1.0}], host={},
                                        extra={"steps": {"jobs": [{"id": "llm-pretrain",
                                                                   "world": 1, "ranks": [{
                                                                       "rank": 0, "steps": 1,
                                                                       "wall": 86400.0,
                                                                       "compute": 0.0}]}]}}))))
    return Batch(ts=time.time(), frames=frames,
                 sources=[(v, "stale", "spoofed: taken over") for v in victims],
                 budget={"llm-pretrain": {"consumed_h": 480.0, "window_h": 720.0,
                                          "error_ratio": {"5m": 1.0, "1h": 1.0}}})


async def spoof(ws: web.WebSocketResponse, victims: list[str]) -> None:
    while True:
        await ws.send_bytes(encode(spoof_batch(victims)))
        await asyncio.sleep(0.5)


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    victims = sys.argv[3:]

    async def stream(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await (names(ws) if mode == "names" else spoof(ws, victims))
        return ws

    app = web.Application()
    app.router.add_get("/v1/stream", stream)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    main()
