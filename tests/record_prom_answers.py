"""Records the answers a real Prometheus gives `tuimon prom`'s queries over the real
exporter captures (tests/test_real_data.py's Prometheus: the dcgm-exporter scrapes of
tests/fixtures/real and a real node_exporter), two refreshes as the test makes them (the
second with three nodes' screens open), into tests/fixtures/recorded/prom_answers.json:
what tests/test_prom_assembly.py reads with no server.

    .venv/bin/python -m tests.record_prom_answers

This host's name (the L4's `Hostname`, node_exporter's uname) is written as `l4-node`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from tests.peers import PROMETHEUS
from tests.test_real_data import DETAIL, real_scrapes_in_prometheus
from tuimon.model.cluster import ClusterState
from tuimon.sources.prometheus import PromOptions, PromSource

OUT = Path(__file__).resolve().parent / "fixtures" / "recorded" / "prom_answers.json"
HOST = "l4-node"


async def record() -> dict[str, Any]:
    here = os.uname().nodename
    refreshes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with real_scrapes_in_prometheus(Path(tmp)) as (url, here, _):
            cluster = ClusterState()
            async with aiohttp.ClientSession() as session:
                source = PromSource(url, cluster, session, PromOptions(every=1.0))
                for detail in ((), (here, *DETAIL)):
                    answers: dict[str, Any] = {}

                    def tap(name: str, body: bytes, into: dict[str, Any] = answers) -> None:
                        into[name] = json.loads(body.decode().replace(f'"{here}"',
                                                                      f'"{HOST}"'))
                    source.client.tap = tap
                    cluster.set_detail(set(detail))
                    await source.refresh()
                    refreshes.append({"detail": [HOST if d == here else d for d in detail],
                                      "answers": answers})
    version = subprocess.run([PROMETHEUS or "prometheus", "--version"], capture_output=True,
                             text=True).stdout.splitlines()[0]
    return {"recorded_with": version, "host": HOST, "refreshes": refreshes}


def main() -> int:
    data = asyncio.run(record())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: {sum(len(r['answers']) for r in data['refreshes'])} answers",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
