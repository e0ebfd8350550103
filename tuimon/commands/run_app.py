"""How a command shows what it watches: the full-screen app (`run_app`), or a text
readout every second or once (`watch`), over a feed that keeps the model up to date
(agents or relays, Prometheus, a simulation), recording every frame where asked."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any

from tuimon.model.cluster import ClusterState
from tuimon.model.judge_config import JudgeConfig
from tuimon.readout import ROW_READS, render
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon_core.closed_pipe import HANGUP_EXIT, hung_up

log = logging.getLogger(__name__)

Recorder = Callable[[str, bytes], None]
# How a viewer gets its data: given the model and an optional recorder, a context in
# which the model is kept up to date (agents or a relay via `watching`, or Prometheus).
Feed = Callable[[ClusterState, "Recorder | None"], AbstractAsyncContextManager[Any]]


def app_or_readout(args: argparse.Namespace, app: Callable[[argparse.Namespace], int],
                   readout: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]) -> int:
    """The full-screen app, or with `--once` or `--plain` the text readout."""
    if args.once or args.plain:
        return asyncio.run(readout(args))
    return app(args)


def agent_feed(targets: list[str], options: StreamOptions,
               relays: list[str] | None = None) -> Feed:
    def feed(state: ClusterState, recorder: Recorder | None) -> AbstractAsyncContextManager[Any]:
        opts = dataclasses.replace(options, recorder=recorder) if recorder else options
        return watching(targets, state, opts, relays=relays or [])
    return feed


def run_app(cluster: ClusterState, feed: Feed, theme: str | None, judge: JudgeConfig,
            before: Callable[[], Awaitable[None]] | None = None,
            after: Callable[[], Awaitable[None]] | None = None,
            record: str | None = None,
            wall: Callable[[], float] | None = None,
            ascii_only: bool | None = None, notes: list[str] | None = None,
            history: Callable[[float], Awaitable[list[dict[str, Any]]]] | None = None) -> int:
    """The full-screen app over `feed`, judging as `judge` says on the clock `wall` (the
    demo's simulated one where given)."""
    from tuimon.sources.recording import RecordingWriter
    from tuimon.ui.app import TuimonApp

    writer = RecordingWriter(record, cluster.name) if record else None
    if writer is not None:
        cluster.recorder = writer.call

    def sources(state: ClusterState) -> list[Coroutine[Any, Any, None]]:
        async def run_all() -> None:
            if before is not None:
                await before()
            try:
                async with feed(state, writer.write if writer is not None else None):
                    await asyncio.Event().wait()  # until the app cancels this task
            finally:
                if after is not None:
                    await after()
        return [run_all()]

    app = TuimonApp(cluster, sources=sources, theme=theme,
                    judgement=judge.judgement(cluster, wall), ascii_only=ascii_only,
                    notes=notes, history=history)
    try:
        app.run()
    finally:
        if writer is not None:
            writer.close()
            # (nowhere to say it where the terminal hung up: the recording is whole)
            with contextlib.suppress(OSError):
                print(f"tuimon: recorded {writer.frames} frames to {writer.path}")
    return app.return_code or 0


async def watch(cluster: ClusterState, feed: Feed, once: bool, judge: Any,
                record: str | None = None) -> int:
    """A text readout every second, or once (`--once`, exiting with the verdict)."""
    from tuimon.sources.recording import RecordingWriter

    writer = RecordingWriter(record, cluster.name) if record else None
    if writer is not None:
        cluster.recorder = writer.call
    try:
        return await _print_loop(cluster, feed, once, judge,
                                 writer.write if writer else None)
    finally:
        if writer is not None:
            writer.close()


async def _print_loop(cluster: ClusterState, feed: Feed, once: bool, judge: Any,
                      recorder: Recorder | None) -> int:
    from tuimon.status import first_samples

    cluster.set_drawn(ROW_READS)  # what the readout shows of every node
    async with feed(cluster, recorder):
        if once:
            # What a one-shot status waits for, so it says what the app says.
            await first_samples(cluster, judge.efficiency, judge.diagnosis.cpu_nodes)
            return await print_once(cluster, judge)
        while True:
            judge.update()
            screen = render(cluster, judge=judge)
            try:
                sys.stdout.write("\x1b[H\x1b[2J" + screen + "\n" if sys.stdout.isatty()
                                 else screen + "\n\n")
                sys.stdout.flush()
            except OSError as exc:
                if not hung_up(sys.stdout, exc):
                    raise
                # The terminal hung up (tuimon.ui.hangup): nobody reads this any more.
                log.warning("the terminal hung up: nobody reads this readout; ending")
                return HANGUP_EXIT
            await asyncio.sleep(1.0)


async def print_once(cluster: ClusterState, judge: Any) -> int:
    """The readout of `--once`, with the verdict `tuimon status` would give as its exit
    code: a condition seen but not yet held long enough is waited for, as status waits,
    so the text, `--once --json` and status name the same findings."""
    from tuimon.status import EXIT, settle, snapshot_findings, verdict

    if cluster.relayed_findings() is None:  # (a relay's come held from their onsets)
        await settle(judge)
    findings = snapshot_findings(judge, cluster, final=True)
    print(render(cluster, max_rows=10_000, judge=judge, findings=findings))
    return EXIT[verdict(cluster, findings)]
