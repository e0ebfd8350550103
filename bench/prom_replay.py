"""`tuimon prom`'s own CPU per refresh, on answers a real Prometheus gave, replayed:
the same bytes every run, so two checkouts (or two edits) compare without the server's
ingest and the fleet's scrapes moving the figure, as they do in bench/prom.py.

    .venv/bin/python bench/prom_replay.py record FILE [--nodes 1024] [--layout labels]
    .venv/bin/python bench/prom_replay.py replay FILE [--refreshes 30] [--profile OUT]

`record` runs bench/prom_fleet.py and a real Prometheus (as bench/prom.py does), then
the app (`TuimonApp` on a 200x50 test screen, `tuimon prom`'s source refreshing every
5 s) for a minute, and keeps every answer's body by query name, in order. `replay` runs
the same app on a source whose queries are answered from FILE (each name's bodies in
turn, again from the first when they run out) at a refresh every `--every` seconds
(the budget's and the inventory's cadences shortened alike), and prints the process's
CPU per refresh (median over windows of 5 refreshes) with the HTTP transport left out:
the JSON decoding, assembly, frames, their check, the model and the screen.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from prom_fleet import LAYOUTS, scrape_configs, targets  # noqa: E402


def _app(sources: Any, seconds: float) -> Any:
    from tuimon.model.cluster import ClusterState
    from tuimon.ui.app import TuimonApp

    app = TuimonApp(ClusterState("bench"), sources=sources, refresh=1.0)

    async def drive() -> None:
        async with app.run_test(size=(200, 50)) as pilot:
            await asyncio.sleep(seconds)
            await pilot.pause()
    asyncio.run(drive())
    return app


def record(path: Path, nodes: int, layout: str, seconds: float) -> None:
    from prom import _query

    from tests.peers import free_port, running_prometheus
    from tuimon.sources.prometheus import PromOptions, prom_watching

    bodies: dict[str, list[str]] = defaultdict(list)
    tmp = Path(tempfile.mkdtemp(prefix="tuimon-prom-replay-"))
    port = free_port()
    ready = tmp / "fleet.ready"
    fleet = subprocess.Popen([sys.executable, str(ROOT / "bench" / "prom_fleet.py"),
                              str(nodes), "--port", str(port), "--ready", str(ready),
                              "--layout", layout], env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        while not ready.exists():
            time.sleep(0.2)
        with running_prometheus(tmp, scrape_configs(nodes, port, layout), 5.0) as url:
            while _query(url, 'count(up{job="fleet"} == 1)') < targets(nodes, layout):
                time.sleep(5)
            time.sleep(15)

            def sources(state: Any) -> list[Any]:
                async def run() -> None:
                    async with prom_watching(url, state, PromOptions(
                            every=5.0, timeout=60.0)) as source:
                        source.client.tap = lambda name, body: bodies[name].append(
                            body.decode())
                        await asyncio.Event().wait()
                return [run()]
            _app(sources, seconds)
    finally:
        fleet.terminate()
        fleet.wait(15)
    with gzip.open(path, "wt") as f:
        json.dump({"nodes": nodes, "layout": layout, "bodies": bodies}, f)
    print(f"{path}: {sum(map(len, bodies.values()))} answers of {len(bodies)} queries")


def replay(path: Path, refreshes: int, every: float, profile: str | None) -> float:
    from tuimon.sources import prom_queries, prometheus
    from tuimon.sources.prom_answers import read_answer
    from tuimon.sources.prometheus import PromOptions, prom_watching

    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    bodies = {name: [b.encode() for b in got] for name, got in doc["bodies"].items()}
    turn: dict[str, int] = defaultdict(int)
    scale = every / 5.0
    prom_queries.INVENTORY_EVERY_S *= scale  # the cadences, as at a 5 s refresh
    prometheus.INVENTORY_SOONEST_S *= scale
    cpu: list[float] = []

    async def query(promql: str, name: str | None = None) -> Any:
        await asyncio.sleep(0)
        got = bodies.get(name or promql) or [b'{"status":"success","data":{"resultType":'
                                             b'"vector","result":[]}}']
        body = got[turn[name or promql] % len(got)]
        turn[name or promql] += 1
        return read_answer(body)[1]

    original = prometheus.PromSource.refresh

    async def refresh(self: Any) -> None:
        await original(self)
        cpu.append(time.process_time())

    prometheus.PromSource.refresh = refresh  # type: ignore[method-assign]

    def sources(state: Any) -> list[Any]:
        async def run() -> None:
            async with prom_watching("http://replay.invalid", state, PromOptions(
                    every=every, budget_every=30.0 * scale,
                    errors_every=15.0 * scale)) as source:
                source.client.query = query  # type: ignore[method-assign]
                await asyncio.Event().wait()
        return [run()]

    seconds = (refreshes + 6) * every
    if profile:
        import cProfile

        with cProfile.Profile() as p:
            app = _app(sources, seconds)
        p.dump_stats(profile)
    else:
        app = _app(sources, seconds)
    steps = [b - a for a, b in itertools.pairwise(cpu[5:])]  # the first ones warm up
    if len(steps) < 5:
        raise SystemExit(f"{len(cpu)} refreshes: too few to measure (--refreshes 10 or more)")
    per = [statistics.mean(steps[i:i + 5]) for i in range(0, len(steps) - 4, 5)]
    print(f"{doc['nodes']} nodes, {doc['layout']} layout: {len(cpu)} refreshes, "
          f"{app.cluster.counts()}; CPU per refresh median {1000 * statistics.median(per):.0f} "
          f"ms (windows of 5: {', '.join(f'{1000 * x:.0f}' for x in per)})")
    return statistics.median(per)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("mode", choices=["record", "replay"])
    ap.add_argument("file", type=Path)
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--layout", choices=LAYOUTS, default="instance")
    ap.add_argument("--seconds", type=float, default=60.0, help="record this long")
    ap.add_argument("--refreshes", type=int, default=30, help="at least 10")
    ap.add_argument("--every", type=float, default=1.0, help="the replay's refresh (s)")
    ap.add_argument("--profile", metavar="OUT", help="cProfile the replay into OUT")
    ap.add_argument("--json", metavar="OUT", help="replay: also write the figure as JSON")
    args = ap.parse_args()
    if args.mode == "record":
        record(args.file, args.nodes, args.layout, args.seconds)
        return
    per = replay(args.file, args.refreshes, args.every, args.profile)
    if args.json:
        with gzip.open(args.file, "rt") as f:
            doc = json.load(f)
        Path(args.json).write_text(json.dumps({
            "nodes": doc["nodes"], "layout": doc["layout"], "every_s": args.every,
            "cpu_s_per_refresh": per}))


if __name__ == "__main__":
    main()
