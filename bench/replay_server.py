"""N node endpoints on loopback speaking the real protocol over real websockets at 1 Hz.

The frames are the seeded simulator's (real agent code, real collectors), read once and
replayed with fresh `seq` and `ts` (stamped just before sending), so that a 2-core
machine can stand in for thousands of nodes. Node i listens on BASE_PORT + i.

    .venv/bin/python bench/replay_server.py NODES --base-port P --ready FILE
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


async def serve(nodes: int, base_port: int, ready: Path) -> None:
    import msgpack
    from aiohttp import web

    from tests.seeded import seeded_cluster

    cluster, _ = await seeded_cluster(nodes=min(nodes, 16), gpus=8, samples=2)
    templates = [(n.hello.to_wire(), n.sample.to_wire()) for n in cluster.nodes.values()]
    clients: dict[int, set[web.WebSocketResponse]] = {i: set() for i in range(nodes)}

    async def stream(request: web.Request) -> web.WebSocketResponse:
        port = request.transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
        i = port - base_port
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        hello = copy.deepcopy(templates[i % len(templates)][0])
        hello["node"] = f"bench{i:04d}"
        await ws.send_bytes(msgpack.packb(hello))
        clients[i].add(ws)
        try:
            async for _ in ws:
                pass
        finally:
            clients[i].discard(ws)
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
            sample = templates[i % len(templates)][1]
            sample["seq"] = seq
            sample["ts"] = time.time()
            data = msgpack.packb(sample)
            for ws in list(clients[i]):
                await ws.send_bytes(data)
        next_at += 1.0
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("nodes", type=int)
    ap.add_argument("--base-port", type=int, default=21000)
    ap.add_argument("--ready", required=True)
    args = ap.parse_args()
    asyncio.run(serve(args.nodes, args.base_port, Path(args.ready)))


if __name__ == "__main__":
    main()
