"""`tuimon status`: no screen, one snapshot of the cluster (or a watch), through agents,
relays or Prometheus, with an exit code a monitoring system reads (tuimon.status); with
`--since`, the incidents the relays' judgement held."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from contextlib import AbstractAsyncContextManager
from typing import Any

from tuimon.commands.connection import connect_options
from tuimon.commands.options import target_options
from tuimon.commands.prom_query import prom_options, prom_query_options
from tuimon.model.cluster import ClusterState
from tuimon.model.judge_config import JudgeConfig, add_slo_options
from tuimon.sources.agent_stream import StreamOptions
from tuimon.sources.targets import TargetError
from tuimon_core.cli_types import duration
from tuimon_core.protocol.text import clean

# A monitoring check's usage error is UNKNOWN (3): its 2 means critical.
USAGE_EXIT = 3


def add_options(p: argparse.ArgumentParser) -> None:
    target_options(p)
    p.add_argument("--watch", type=float, default=0.0, metavar="SECONDS",
                   help="keep watching this long; the exit code is the worst seen")
    p.add_argument("--json", action="store_true",
                   help="print the snapshot as JSON (the same figures as the text)")
    p.add_argument("--job", metavar="NAME",
                   help="one job whole, as its screen (b) shows it: budget spent by "
                        "kind, waits, ranks, nodes, findings (exit code: the cluster's)")
    p.add_argument("--since", type=duration, metavar="DURATION",
                   help="through relays: the incidents their judgement held over the "
                        "last DURATION (6h, 2d), newest first, with what each cost; "
                        "with --job, those that touched its nodes")
    p.add_argument("--prometheus", metavar="URL",
                   help="check the cluster through this Prometheus server (as `tuimon "
                        "prom` watches it) instead of its agents")
    prom_query_options(p)
    add_slo_options(p)


def run(args: argparse.Namespace) -> int:
    from tuimon.status import EXIT, run_status

    if getattr(args, "job", None) and args.watch:
        raise TargetError("--job is one snapshot of the job: without --watch")
    if getattr(args, "since", None) is not None:  # (`prom --json` has no --since)
        return _history(args)
    feed = None
    if args.prometheus:
        from tuimon.sources.prometheus import prom_watching

        if args.targets or args.relay:
            raise TargetError("status: give agents, relays or --prometheus, not both")
        args.url, args.every = args.prometheus, 1.0
        options_of_prom = prom_options(args)
        if not args.watch:  # a snapshot: the ports' error counters read once count nothing
            options_of_prom = dataclasses.replace(options_of_prom, errors_every=None)
        targets: list[str] = []
        relays: list[str] = []
        options = StreamOptions()

        def feed(state: ClusterState) -> AbstractAsyncContextManager[Any]:
            return prom_watching(args.prometheus, state, options_of_prom)
    else:
        targets, relays, options = connect_options(args)
    config = JudgeConfig.from_args(args)
    try:
        return asyncio.run(run_status(targets, options, relays=relays, watch=args.watch,
                                      config=config, as_json=args.json, name=args.name,
                                      feed=feed, job=getattr(args, "job", None)))
    except BrokenPipeError:
        raise  # the reader went away (`| head -1`): not the check's fault (closed_pipe)
    except Exception as exc:
        # A bug in the check is no verdict on the cluster: UNKNOWN, as a monitoring
        # system expects of a check that failed, with the traceback for the report.
        import traceback

        traceback.print_exc(file=sys.stderr)
        print(clean(f"UNKNOWN: internal error in tuimon status: {type(exc).__name__}: "
                    f"{exc}"[:300]), flush=True)
        return EXIT["unknown"]


def _history(args: argparse.Namespace) -> int:
    """`status --relay R --since 6h`: the incidents the relays' judgement held."""
    from tuimon.status import EXIT, print_history

    targets, relays, options = connect_options(args)
    if targets or args.prometheus or not relays:
        raise TargetError("--since reads the history a relay keeps: give --relay only")
    return EXIT[asyncio.run(print_history(relays, options, args.since, args.job, args.json))]
