"""What step reporting costs a training loop: microseconds per step.

    .venv/bin/python bench/reporter.py [--steps 200000] [--runs 5]

Measures `with reporter.step(): with reporter.waiting(): pass` (the whole per-step
overhead: two context managers, timing, msgpack, one non-blocking sendto) against a
listening Unix socket drained by another process, and with no agent at all (the send
fails and is counted). Medians of repeated runs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.reporter import StepReporter


def _per_step_us(reporter: StepReporter, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        with reporter.step(samples=32), reporter.waiting():
            pass
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="tuimon-reporter-")
    path = os.path.join(folder, "steps.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    pid = os.fork()
    if pid == 0:  # a drain standing in for the agent
        while True:
            server.recv(4096)
    try:
        live = [_per_step_us(StepReporter("bench", 0, 1, socket_path=path), args.steps)
                for _ in range(args.runs)]
        absent = [_per_step_us(StepReporter("bench", 0, 1, socket_path=path + ".none"),
                               args.steps) for _ in range(args.runs)]
        baseline = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                pass
            baseline.append((time.perf_counter() - t0) / args.steps * 1e6)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    print("| reporter, per step | median of runs |")
    print("|---|---|")
    print(f"| agent listening | {statistics.median(live):.2f} us |")
    print(f"| no agent (send fails, counted) | {statistics.median(absent):.2f} us |")
    print(f"| empty loop, for reference | {statistics.median(baseline):.3f} us |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "live_us": statistics.median(live), "absent_us": statistics.median(absent),
            "loop_us": statistics.median(baseline)}, indent=2))


if __name__ == "__main__":
    main()
