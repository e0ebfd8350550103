"""`tuimon relay`: fan in many agents (or relays), fan out batches to viewers, keep the
run's SLO ledger. Part of the viewer's install: the agent's install never imports it
(`tuimon-agent relay` runs this when it is installed)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path

from tuimon.model.judge_config import JudgeConfig, add_judge_options, add_slo_options
from tuimon.model.slo import DEFAULT_HOURS
from tuimon.relay.cadence import BATCH_EVERY_S
from tuimon_core.cli_types import positive_float, positive_int
from tuimon_core.logs import add_log_level_option
from tuimon_core.ports import DEFAULT_RELAY_PORT
from tuimon_core.version import __version__

log = logging.getLogger("tuimon.relay")


def add_relay_options(p: argparse.ArgumentParser) -> None:
    """`tuimon relay`'s options."""
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help="agents: host[:port], Slurm host lists (gpu[001-128]:9477)")
    p.add_argument("--relay", action="append", default=[], metavar="HOST[:PORT]",
                   help="an upstream relay (relay of relays; default port 9478), which may "
                        "speak for the nodes it carries; repeatable")
    p.add_argument("--targets-file", metavar="F", help="one target per line")
    p.add_argument("--listen", default="127.0.0.1:9478", metavar="HOST:PORT",
                   help="address viewers connect to (default 127.0.0.1:9478)")
    p.add_argument("--name", default="", help="relay name sent to viewers (default: host name)")
    p.add_argument("--token-file", metavar="F",
                   help="bearer token viewers must send; required off loopback")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback address without a token")
    p.add_argument("--tls-cert", metavar="F", help="serve viewers over HTTPS/WSS")
    p.add_argument("--tls-key", metavar="F", help="the certificate's private key")
    p.add_argument("--upstream-token-file", metavar="F", help="bearer token for the agents")
    p.add_argument("--upstream-tls", action="store_true", help="connect to agents with TLS")
    p.add_argument("--upstream-tls-ca", metavar="F", help="CA bundle that signed the agents' "
                                                          "certificates")
    p.add_argument("--upstream-tls-insecure", action="store_true",
                   help="do not verify the agents' certificates")
    p.add_argument("--upstream-insecure", action="store_true",
                   help="send the upstream token over plain HTTP to non-loopback agents "
                        "anyway (the network is trusted)")
    p.add_argument("--ledger", metavar="FILE",
                   help="SQLite file of the SLO ledger (default: $STATE_DIRECTORY/ledger.db "
                        "or ~/.local/state/tuimon/ledger.db)")
    p.add_argument("--no-ledger", action="store_true", help="keep no ledger")
    p.add_argument("--keep-days", type=positive_float(36500.0), default=30.0,
                   help="ledger retention (default 30)")
    p.add_argument("--flush-every", type=positive_float(3600.0), default=10.0, metavar="S",
                   help="seconds between ledger writes: at most this much is lost to a "
                        "kill -9 (default 10)")
    p.add_argument("--slo-hours", type=positive_float(1e6), default=DEFAULT_HOURS,
                   help=f"SLO window the budget is counted over (default {DEFAULT_HOURS:.0f})")
    p.add_argument("--stopped-most", type=positive_float(1e6), default=24.0, metavar="H",
                   help="a job whose ranks all fall silent loses that time (`stopped`) until "
                        "they report again, unless they said the run is complete "
                        "(StepReporter.finish); silent longer than this many hours, it is "
                        "taken as ended and not counted (default 24)")
    # What the relay judges its nodes with, as a viewer takes it.
    add_judge_options(p)
    add_slo_options(p, hours=False)
    p.add_argument("--interval", type=positive_float(60.0, least=0.05), default=BATCH_EVERY_S,
                   metavar="S",
                   help=f"seconds between batches to each viewer (default {BATCH_EVERY_S:g})")
    p.add_argument("--max-viewers", type=positive_int(100_000), default=256,
                   help="viewers served at once; one more is refused with a reason "
                        "(default 256)")
    add_log_level_option(p)
    # Also after the command (`tuimon relay ... --debug`, and so through `tuimon-agent
    # relay`): SUPPRESS keeps `tuimon --debug relay` from being reset to False here.
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the traceback of any error, usage errors too")


def default_ledger_path() -> Path:
    state = os.environ.get("STATE_DIRECTORY")  # systemd's StateDirectory=
    if state:
        return Path(state.split(":")[0]) / "ledger.db"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "tuimon" / "ledger.db"


def run_relay(args: argparse.Namespace) -> int:
    """Serve until stopped; wrong targets, ledger, token or TLS files are refused
    (UsageError) before anything listens."""
    # Here, not at the top: every `tuimon` command's parser imports this module for the
    # options above, and none but this one needs the relay's server.
    from tuimon.relay import RelayConfig, build_relay
    from tuimon.sources.targets import read_targets_file
    from tuimon_core.serving.guard import serve
    from tuimon_core.serving.security import (
        check_bind_rule,
        client_ssl_context,
        load_token,
        parse_listen,
        server_ssl_context,
    )

    items = list(args.targets)
    if args.targets_file:
        items += read_targets_file(args.targets_file)
    listen = parse_listen(args.listen, DEFAULT_RELAY_PORT)
    token = load_token(args.token_file) if args.token_file else None
    check_bind_rule(listen, token, args.insecure)
    upstream_ssl = (client_ssl_context(args.upstream_tls_ca, args.upstream_tls_insecure)
                    if args.upstream_tls or args.upstream_tls_ca
                    or args.upstream_tls_insecure else None)
    config = RelayConfig(
        targets=items, relays=list(args.relay), listen=args.listen,
        name=args.name or socket.gethostname(),
        ledger=None if args.no_ledger else (args.ledger or default_ledger_path()),
        ledger_keep_days=args.keep_days, slo_hours=args.slo_hours,
        stopped_most_h=args.stopped_most, interval=args.interval,
        max_viewers=args.max_viewers, token=token,
        flush_every=args.flush_every,
        insecure=args.insecure,
        upstream_token=(load_token(args.upstream_token_file)
                        if args.upstream_token_file else None),
        upstream_ssl=upstream_ssl, upstream_insecure=args.upstream_insecure,
        judge=JudgeConfig.from_args(args))
    app, state = build_relay(config)
    ssl_ctx = server_ssl_context(args.tls_cert, args.tls_key)

    def ready() -> None:  # said once it listens: an address in use is an error instead
        log.info("tuimon relay %s on %s://%s: %d targets, %d relays, ledger %s, judging "
                 "with %s", __version__, "https" if ssl_ctx else "http", listen,
                 len(state.targets), len(state.relays),
                 state.ledger.path if state.ledger else "off",
                 f"a topology of {len(config.judge.topology)} nodes" if config.judge.topology
                 else "no topology")
    serve(app, listen, ssl_ctx, on_ready=ready)
    return 0
