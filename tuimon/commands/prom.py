"""`tuimon prom URL`: watch the cluster through Prometheus (or Thanos, Mimir,
VictoriaMetrics), in the app, `--plain`, `--once` (`--json`: the status document), or
with no screen, its judgement served on /metrics (`--serve`: tuimon.prom_judge_command)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp

from tuimon.commands import status
from tuimon.commands.options import view_options
from tuimon.commands.prom_query import prom_options, prom_query_options
from tuimon.commands.run_app import Feed, Recorder, print_once, run_app, watch
from tuimon.model.cluster import ClusterState
from tuimon.model.judge_config import JudgeConfig, add_judge_options, add_slo_options
from tuimon.prom_judge_command import judge_options, serve_flags_alone
from tuimon.readout import ROW_READS
from tuimon.sources.targets import TargetError
from tuimon_core.cli_types import positive_float
from tuimon_core.logs import log_to_stderr


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="the server's base URL, e.g. http://prometheus:9090")
    p.add_argument("--token-file", metavar="F", help="bearer token for the server")
    p.add_argument("--tls-ca", metavar="F", help="CA bundle for an https:// server")
    p.add_argument("--tls-insecure", action="store_true",
                   help="do not verify the server's certificate")
    p.add_argument("--insecure", action="store_true",
                   help="send the token over plain http:// to a non-loopback server anyway")
    prom_query_options(p)
    p.add_argument("--every", type=positive_float(3600.0, least=0.5), default=5.0,
                   metavar="S",
                   help="seconds between refreshes (default 5)")
    p.add_argument("--name", default="cluster", help="cluster name shown in the header")
    add_judge_options(p)
    p.add_argument("--json", action="store_true",
                   help="with --once: print the document `tuimon status --json` prints "
                        "(and exit with its codes: 0 ok, 1 warning, 2 critical, 3 unknown)")
    view_options(p)
    add_slo_options(p)
    judge_options(p)


def run(args: argparse.Namespace) -> int:
    if args.serve:
        # No screen: the judgement served on /metrics until stopped (tuimon.prom_judge).
        from tuimon.prom_judge_command import run_prom_judge

        if args.once or args.json or args.plain or args.record:
            raise TargetError("--serve judges until stopped and draws nothing: without "
                              "--once, --json, --plain or --record")
        log_to_stderr("info")
        return run_prom_judge(args, prom_options(args), JudgeConfig.from_args(args))
    alone = serve_flags_alone(args)
    if alone:
        raise TargetError(f"{', '.join(alone)}: options of --serve, which was not given")
    if args.json:
        if not args.once:
            raise TargetError("--json goes with --once (one document); the app and --plain "
                              "draw for people")
        # One document, the status check's, through the same Prometheus queries.
        args.prometheus, args.targets, args.relay, args.watch = args.url, [], [], 0.0
        return status.run(args)
    feed = _feed(args)
    cluster = ClusterState(args.name)
    if args.once:
        return asyncio.run(_once(args, cluster))
    if args.plain:
        judge = JudgeConfig.from_args(args).judgement(cluster)
        return asyncio.run(watch(cluster, feed, args.once, judge, args.record))
    return run_app(cluster, feed, args.theme, JudgeConfig.from_args(args), record=args.record,
                   ascii_only=args.ascii)


def _feed(args: argparse.Namespace) -> Feed:
    from tuimon.sources.prometheus import prom_watching

    options = prom_options(args)

    def feed(state: ClusterState, recorder: Recorder | None) -> AbstractAsyncContextManager[Any]:
        return prom_watching(args.url, state, dataclasses.replace(options, recorder=recorder))
    return feed


async def _once(args: argparse.Namespace, cluster: ClusterState) -> int:
    """One refresh, printed; Prometheus failing is an error (exit 2), not an empty table."""
    from tuimon.sources.prometheus import PromError, PromSource
    from tuimon.sources.recording import RecordingWriter

    # One refresh: the ports' error counters read once would count nothing.
    options = dataclasses.replace(prom_options(args), errors_every=None)
    writer = RecordingWriter(args.record, cluster.name) if args.record else None
    if writer is not None:
        options = dataclasses.replace(options, recorder=writer.write)
        cluster.recorder = writer.call
    judge = JudgeConfig.from_args(args).judgement(cluster)
    cluster.set_drawn(ROW_READS)  # what the readout shows of every node
    try:
        async with aiohttp.ClientSession() as session:
            await PromSource(args.url, cluster, session, options).refresh()
    except PromError as exc:
        print(f"tuimon: {exc}", file=sys.stderr)
        return 2
    finally:
        if writer is not None:
            writer.close()
    return await print_once(cluster, judge)
