"""The wire: cost and size of one node's frame, beside the same node as Prometheus text.

One simulated full node (8 GPUs, 8 InfiniBand ports with hw_counters, file systems and
disks: the seeded simulator, read by the real collectors) gives one `sample`. Measured
in one process, alternating, medians of repeated runs:

  - msgpack: encoding the sample (`encode`), decoding it with every check a viewer makes
    (`decode`), the relay's envelope-only decode (`decode(deep=False)`), bytes per frame
    (raw and gzip, as a recording stores it);
  - Prometheus text: the agent's own `/metrics` exposition of the same node at the same
    moment (what all-smi and dcgm-exporter serve; it carries cumulative counters where
    the frame carries rates), rendered by prometheus_client and parsed by its parser
    (`text_string_to_metric_families`, reading every sample), and its bytes.

    .venv/bin/python bench/wire.py [--runs 5] [--iterations 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _per_call_us(fn: Callable[[], object], iterations: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - t0) / iterations * 1e6


async def _node() -> tuple[bytes, str]:
    from agent.metrics import make_registry, render
    from tests.seeded import seeded_cluster
    from tuimon_core.protocol import encode

    _, sim = await seeded_cluster(nodes=1, gpus=8, samples=3)
    agent = sim.members[0].agent
    assert agent.latest is not None, "the seeded agent has sampled"
    frame = encode(agent.latest)
    text = render(make_registry(agent)).decode()
    return frame, text


def measure(runs: int, iterations: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from tuimon_core.protocol import decode, encode, unpack

    frame, text = asyncio.run(_node())
    sample = decode(frame)
    assert sample is not None, "a frame of this version decodes"
    prom_series = sum(len(f.samples) for f in text_string_to_metric_families(text))

    def parse_text() -> None:
        for family in text_string_to_metric_families(text):
            for _ in family.samples:
                pass

    rows: dict[str, list[float]] = {k: [] for k in (
        "encode_us", "decode_us", "decode_envelope_us", "unpack_us", "prom_parse_us")}
    for _ in range(runs):
        rows["encode_us"].append(_per_call_us(lambda: encode(sample), iterations))
        rows["decode_us"].append(_per_call_us(lambda: decode(frame), iterations))
        rows["decode_envelope_us"].append(
            _per_call_us(lambda: decode(frame, deep=False), iterations))
        rows["unpack_us"].append(_per_call_us(lambda: unpack(frame), iterations))
        rows["prom_parse_us"].append(_per_call_us(parse_text, max(1, iterations // 10)))
    out = {k: statistics.median(v) for k, v in rows.items()}
    out.update({
        "frame_bytes": len(frame),
        "frame_gzip_bytes": len(gzip.compress(frame)),
        "prom_text_bytes": len(text.encode()),
        "prom_series": prom_series,
    })
    out["parse_ratio_prom_over_decode"] = out["prom_parse_us"] / out["decode_us"]
    out["bytes_ratio_prom_over_frame"] = out["prom_text_bytes"] / out["frame_bytes"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    r = measure(args.runs, args.iterations)
    print(f"| one full node (8 GPUs, 8 IB ports, storage) | median of {args.runs} runs |")
    print("|---|---|")
    print(f"| msgpack frame, bytes (gzip) | {r['frame_bytes']} ({r['frame_gzip_bytes']}) |")
    print(f"| encode | {r['encode_us']:.0f} us |")
    print(f"| decode with every check (viewer) | {r['decode_us']:.0f} us |")
    print(f"| decode, envelope only (relay) | {r['decode_envelope_us']:.0f} us |")
    print(f"| msgpack unpack alone | {r['unpack_us']:.0f} us |")
    print(f"| Prometheus text of the same node, bytes ({r['prom_series']} series) | "
          f"{r['prom_text_bytes']} |")
    print(f"| Prometheus text parse (prometheus_client) | {r['prom_parse_us']:.0f} us |")
    print(f"| ratio: text parse / frame decode | {r['parse_ratio_prom_over_decode']:.1f}x |")
    print(f"| ratio: text bytes / frame bytes | {r['bytes_ratio_prom_over_frame']:.1f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
