"""N node endpoints on loopback speaking the real protocol over real websockets at 1 Hz.

The frames are the seeded simulator's (real agent code, real collectors), read once and
replayed with fresh `seq` and `ts` (stamped just before sending), so that a 2-core
machine can stand in for thousands of nodes. Node i listens on BASE_PORT + i. Like an
agent, each endpoint honours its client's `subscribe` (families; `interval` in whole
ticks): the app takes overviews, a relay what its viewers want. Each template is encoded
once per family set, and only `seq` and `ts` are packed per frame.

`--rate R` sends R samples per node per second (a 2-core machine cannot carry 16,384
nodes at 1 Hz: the bench says when it scales the rate down).

    .venv/bin/python bench/replay_server.py NODES --base-port P --ready FILE
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Template:
    """One node's sample, its pairs other than seq and ts packed once per family set."""

    def __init__(self, wire: dict[str, Any]) -> None:
        self.wire = wire
        self._bodies: dict[frozenset[str] | None, tuple[int, bytes]] = {}

    def frame(self, families: frozenset[str] | None, seq: int, ts: float) -> bytes:
        import msgpack

        from tuimon_core.protocol.codec import map_header
        from tuimon_core.protocol.families import keep_families

        body = self._bodies.get(families)
        if body is None:
            wire = keep_families(dict(self.wire), families)
            pairs = [msgpack.packb(k) + msgpack.packb(v) for k, v in wire.items()
                     if k not in ("seq", "ts")]
            body = self._bodies[families] = (len(pairs), b"".join(pairs))
        n, data = body
        return (map_header(n + 2) + b"\xa3seq" + msgpack.packb(seq) + b"\xa2ts"
                + msgpack.packb(ts) + data)


async def serve(nodes: int, base_port: int, ready: Path, rate: float = 1.0) -> None:
    import msgpack
    from aiohttp import WSMsgType, web

    from tests.seeded import seeded_cluster
    from tuimon_core.protocol import ProtocolError, Subscribe, decode

    cluster, _ = await seeded_cluster(nodes=min(nodes, 16), gpus=8, samples=2)
    templates = [(n.hello.to_wire(), Template(n.sample.to_wire()))
                 for n in cluster.nodes.values() if n.hello and n.sample]
    # Per node: its clients and, per client, (families, every how many ticks).
    clients: dict[int, dict[web.WebSocketResponse, tuple[frozenset[str] | None, int]]] = {
        i: {} for i in range(nodes)}

    async def stream(request: web.Request) -> web.WebSocketResponse:
        port = request.transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
        i = port - base_port
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        hello = copy.deepcopy(templates[i % len(templates)][0])
        hello["node"] = f"bench{i:05d}"
        await ws.send_bytes(msgpack.packb(hello))
        clients[i][ws] = (None, 1)
        try:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY:
                    continue
                try:
                    sub = decode(msg.data)
                except ProtocolError:
                    continue
                if isinstance(sub, Subscribe):
                    every = max(1, round((sub.interval or 0) * rate))
                    clients[i][ws] = (None if sub.families is None
                                      else frozenset(sub.families), every)
        finally:
            clients[i].pop(ws, None)
        return ws

    app = web.Application()
    app.router.add_get("/v1/stream", stream)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for i in range(nodes):
        await web.TCPSite(runner, "127.0.0.1", base_port + i, backlog=16).start()
    ready.write_text("ok")
    seq = 0
    next_at = time.monotonic()
    while True:
        seq += 1
        for i in range(nodes):
            if not clients[i]:
                continue
            template = templates[i % len(templates)][1]
            ts = time.time()
            for ws, (families, every) in list(clients[i].items()):
                if seq % every == 0:
                    await ws.send_bytes(template.frame(families, seq, ts))
        next_at += 1.0 / rate
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("nodes", type=int)
    ap.add_argument("--base-port", type=int, default=21000)
    ap.add_argument("--ready", required=True)
    ap.add_argument("--rate", type=float, default=1.0, help="samples per node per second")
    args = ap.parse_args()
    asyncio.run(serve(args.nodes, args.base_port, Path(args.ready), args.rate))


if __name__ == "__main__":
    main()
