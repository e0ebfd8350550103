"""`tuimon replay FILE`: play a recording back in the app, on the recording's clock."""

from __future__ import annotations

import argparse
import sys

from tuimon.commands.options import ascii_option, log_option, theme_option
from tuimon.model import judge_config
from tuimon.model.cluster import ClusterState
from tuimon.model.judge_config import JudgeConfig
from tuimon_core.cli_types import positive_float
from tuimon_core.closed_pipe import HANGUP_EXIT


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--speed", type=positive_float(10000.0), default=1.0,
                   help="seconds of the recording per second (default 1)")
    theme_option(p)
    p.add_argument("--topology", metavar="F",
                   help="Slurm topology.conf: group the recording's nodes by leaf switch")
    ascii_option(p)
    log_option(p)


def run(args: argparse.Namespace) -> int:
    from tuimon.sources.recording import ReplayControl, read_recording, replay
    from tuimon.ui.replay_app import ReplayApp

    rec = read_recording(args.file)
    control = ReplayControl(speed=args.speed)
    # Ages on the recording's clock: a node silent in the recording goes stale and down
    # as it did live, at the replay's pace, and not while it is paused.
    cluster = ClusterState(f"replay of {rec.name or args.file}",
                           clock=lambda: control.position,
                           wall=lambda: rec.started + control.position)
    # The judgement on the recording's clock too: its windows and holds as they were.
    judge = JudgeConfig(topology=judge_config.topology(args.topology))
    app = ReplayApp(cluster, control, rec.duration,
                    sources=lambda state: [replay(rec, state, control)], theme=args.theme,
                    judgement=judge.judgement(cluster, lambda: rec.started + control.position),
                    damage=rec.damage, ascii_only=args.ascii)
    app.run()
    if app.return_code == HANGUP_EXIT:  # the terminal hung up: nowhere to say more
        return HANGUP_EXIT
    if rec.damage:
        print(f"tuimon: {args.file}: {rec.damage}", file=sys.stderr)
    return app.return_code or 0
