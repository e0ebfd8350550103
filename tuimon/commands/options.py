"""Options more than one command takes: where the agents are and how to reach them
(connect, status, report), and how to show what arrives (connect, prom, demo, replay)."""

from __future__ import annotations

import argparse

from tuimon.model.judge_config import add_judge_options
from tuimon_core.cli_docs import complete_from
from tuimon_core.cli_types import positive_float


def target_options(p: argparse.ArgumentParser) -> None:
    """Where the agents are and how to reach them: shared by connect and status."""
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help="agents: host[:port], Slurm host lists allowed: gpu[001-128]:9477")
    p.add_argument("--relay", action="append", default=[], metavar="HOST[:PORT]",
                   help="a relay (default port 9478), which may speak for the nodes it "
                        "carries; repeatable")
    p.add_argument("--targets-file", metavar="F", help="one target per line")
    tls_options(p, "the agents", "the agents'")
    p.add_argument("--name", default="cluster", help="cluster name shown in the header")
    p.add_argument("--nodes", metavar="HOSTLIST", action="append",
                   help="through a relay: only these nodes (Slurm host list; repeatable)")
    p.add_argument("--families", metavar="LIST",
                   help="only these families, comma-separated: gpu,host,fabric,storage,steps,"
                        "events")
    p.add_argument("--every", type=positive_float(3600.0), metavar="S",
                   help="ask for samples at most every S seconds (slower links)")
    p.add_argument("--full-frames", action="store_true",
                   help="the app: take every value of every node, not each node's overview "
                        "(the open node always comes whole); costs ~20x the bytes and CPU")
    add_judge_options(p)


def tls_options(p: argparse.ArgumentParser, whom: str, whose: str) -> None:
    """The token and TLS a viewer reaches agents or a relay with."""
    p.add_argument("--token-file", metavar="F", help=f"bearer token for {whom}")
    p.add_argument("--tls", action="store_true", help="connect with TLS (wss://, https://)")
    p.add_argument("--insecure", action="store_true",
                   help="send the token over plain HTTP to non-loopback targets anyway")
    p.add_argument("--tls-ca", metavar="F", help=f"CA bundle that signed {whose} "
                   "certificates")
    p.add_argument("--tls-insecure", action="store_true",
                   help=f"do not verify {whose} certificates")


def theme_option(p: argparse.ArgumentParser) -> None:
    action = p.add_argument("--theme", help="theme name (t cycles them in the app): the "
                            "packaged ones and the user's own files")
    complete_from(action, _theme_names)


def _theme_names() -> list[str]:
    from tuimon.ui.theme_files import load_themes  # Textual: only when a script is printed

    return sorted({t.name for t in load_themes()[0]})


def view_options(p: argparse.ArgumentParser) -> None:
    """How to show what arrives: shared by connect, prom and demo."""
    p.add_argument("--once", action="store_true",
                   help="print one readout after the first samples and exit with the "
                        "verdict, as `tuimon status`: 0 ok, 1 warning, 2 critical")
    p.add_argument("--plain", action="store_true",
                   help="print a text readout every second instead of the full-screen app")
    theme_option(p)
    p.add_argument("--record", metavar="FILE",
                   help="write every frame as received (gzip, msgpack) for replay")
    ascii_option(p)
    log_option(p)


def ascii_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ascii", action="store_true", default=None,
                   help="draw with ASCII only (the default where the locale, LC_ALL, "
                        "LC_CTYPE or LANG, is not UTF-8: C, POSIX, a serial console)")


def log_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-file", metavar="FILE",
                   help="the full-screen app's log: warnings and internal errors with their "
                        "tracebacks (default $XDG_STATE_HOME/tuimon/tuimon.log)")
