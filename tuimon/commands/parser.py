"""The `tuimon` command line: the global options, and each command with its one line of
help; the command's own module adds its options (tuimon.commands.*, and
tuimon.relay.command for the relay)."""

from __future__ import annotations

import argparse

from tuimon.commands import connect, demo, prom, replay, report, rules, status
from tuimon.manual import SECTIONS as MANUAL_SECTIONS
from tuimon.relay.command import add_relay_options
from tuimon.snapshot_waits import WAITS
from tuimon_core.cli_docs import add_doc_options
from tuimon_core.cli_parser import Parser
from tuimon_core.version import __version__

COMMANDS = ("connect", "status", "replay", "demo", "prom", "relay", "rules", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tuimon", description="Live monitor for GPU "
                                     "training clusters.")
    parser.add_argument("--version", action="version", version=f"tuimon {__version__}")
    add_doc_options(parser, MANUAL_SECTIONS)
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of any error, usage errors too")
    parser.add_argument("--cluster", metavar="NAME",
                        help="a cluster from the config file (alone: connect to it)")
    parser.add_argument("--config", metavar="FILE",
                        help="config file (default $XDG_CONFIG_HOME/tuimon/config.toml)")
    sub = parser.add_subparsers(dest="command", required=True)
    connect.add_options(sub.add_parser("connect", help="watch agents or a relay: host[:port], "
                                                       "gpu[001-128]:PORT, login1:9478"))
    prom.add_options(sub.add_parser("prom", help="watch the cluster through Prometheus (or "
                                                 "Thanos, Mimir, VictoriaMetrics): agent, "
                                                 "dcgm-exporter and node_exporter metrics"))
    replay.add_options(sub.add_parser("replay", help="play a recording back in the app: space "
                                                     "pauses, . steps, [ ] seek a minute, + - "
                                                     "speed"))
    status.add_options(sub.add_parser(
        "status", help="no screen: one snapshot (or --watch), exit code 0 ok / 1 warning / "
                       "2 critical / 3 unknown",
        usage_exit=status.USAGE_EXIT,
        description=f"One snapshot of the cluster, or a watch. {WAITS} Exit code 0 ok, 1 "
                    "warning, 2 critical, 3 unknown (a usage error too: the check, not the "
                    "cluster, is wrong)."))
    demo.add_options(sub.add_parser("demo", help="simulate a cluster on loopback and watch "
                                                 "it"))
    rules.add_options(sub.add_parser("rules", help="write Prometheus recording and burn-rate "
                                                   "alerting rules for the training SLO (the "
                                                   "app's windows and thresholds)"))
    report.add_options(sub.add_parser(
        "report", help="one job's run as a document for a review, from a relay's ledger: "
                       "the SLI over the run, the budget by kind and cause, the incidents, "
                       "the slowest nodes and leaves, the fleet's differences",
        description="One job's run as a document a review starts from, read from the "
                    "relay that keeps its ledger (GET /v1/report): Markdown for a ticket, "
                    "or one self-contained HTML file with the plots drawn in it. The "
                    "budget is the run's, under --slo-target and --slo-hours as `status "
                    "--job` has it. Exit code 0, 2 for a usage error, 3 (unknown) when the "
                    "relay cannot be read or counts no such job."))
    add_relay_options(sub.add_parser("relay", help="fan in many agents (or relays), fan out "
                                                   "batches to viewers, keep the run's SLO "
                                                   "ledger"))
    return parser
