"""`tuimon connect`: watch agents or relays, in the full-screen app, as a text readout
every second (`--plain`), or once (`--once`, exiting with the verdict)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from tuimon.commands.connection import connect_options
from tuimon.commands.options import target_options, view_options
from tuimon.commands.run_app import agent_feed, app_or_readout, run_app, watch
from tuimon.model.cluster import ClusterState
from tuimon.model.judge_config import JudgeConfig, add_slo_options
from tuimon.sources.agent_stream import StreamOptions


def add_options(p: argparse.ArgumentParser) -> None:
    target_options(p)
    view_options(p)
    add_slo_options(p)


def run(args: argparse.Namespace) -> int:
    return app_or_readout(args, _app, _readout)


def _app(args: argparse.Namespace) -> int:
    targets, relays, options = connect_options(args)
    # The app draws the cluster from overviews and opens a node whole (`status` and the
    # readout print every node's values; --families asks for exactly what it says).
    if not args.families and not args.full_frames:
        options = dataclasses.replace(options, overview=True)
    cluster = ClusterState(args.name)
    for t in [*targets, *relays]:
        cluster.add_target(t)
    return run_app(cluster, agent_feed(targets, options, relays), args.theme,
                   JudgeConfig.from_args(args), record=args.record, ascii_only=args.ascii,
                   notes=getattr(args, "notes", None),
                   history=history(relays, options) if relays else None)


def history(relays: list[str], options: StreamOptions) -> Callable[[float], Awaitable[
        list[dict[str, Any]]]]:
    """The relays' incidents over the last `seconds`, newest first (the history screen)."""
    from tuimon.sources.relay_history import read_history

    async def read(seconds: float) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for relay in relays:
            found += (await read_history(relay, options, since=seconds))["incidents"]
        return sorted(found, key=lambda i: -i["onset"])
    return read


async def _readout(args: argparse.Namespace) -> int:
    targets, relays, options = connect_options(args)
    cluster = ClusterState(args.name)
    return await watch(cluster, agent_feed(targets, options, relays), args.once,
                       JudgeConfig.from_args(args).judgement(cluster), args.record)
