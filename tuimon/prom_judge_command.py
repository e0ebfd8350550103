"""`tuimon prom`'s options for serving its judgement (`--serve HOST:PORT`), and the
command that serves it (tuimon.prom_judge), imported only when asked for."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from tuimon.model.judge_config import JudgeConfig
from tuimon_core.ports import DEFAULT_JUDGE_PORT
from tuimon_core.serving.security import (
    check_bind_rule,
    load_token,
    parse_listen,
    server_ssl_context,
)
from tuimon_core.version import __version__

log = logging.getLogger("tuimon.prom_judge")


def run_prom_judge(args: argparse.Namespace, options: Any, config: JudgeConfig) -> int:
    """Serve until stopped; a wrong address, token or TLS file is refused (UsageError)
    before anything listens."""
    listen = parse_listen(args.serve, DEFAULT_JUDGE_PORT)
    token = load_token(args.serve_token_file) if args.serve_token_file else None
    check_bind_rule(listen, token, args.serve_insecure)
    ssl_ctx = server_ssl_context(args.serve_tls_cert, args.serve_tls_key)
    from tuimon.prom_judge import PromJudge, build_judge_app
    from tuimon_core.serving.guard import serve

    # Every field of every node: the judgement reads what no screen draws.
    state = PromJudge(args.url, options, config, args.name, token)
    app = build_judge_app(state)

    def ready() -> None:  # said once it listens: an address in use is an error instead
        log.info("tuimon %s judging %s every %g s (%s), serving /metrics on %s://%s",
                 __version__, args.url, options.every,
                 f"a topology of {len(config.topology)} nodes" if config.topology
                 else "no topology", "https" if ssl_ctx else "http", listen)
    serve(app, listen, ssl_ctx, on_ready=ready)
    return 0


def judge_options(p: argparse.ArgumentParser) -> None:
    """`tuimon prom`'s options for serving its judgement."""
    p.add_argument("--serve", metavar="HOST:PORT",
                   help="no screen: judge around the clock and serve the findings on "
                        f"/metrics for Prometheus to scrape (default port {DEFAULT_JUDGE_PORT})")
    p.add_argument("--serve-token-file", metavar="F",
                   help="with --serve: bearer token scrapers must send; required off loopback")
    p.add_argument("--serve-insecure", action="store_true",
                   help="with --serve: allow a non-loopback address without a token")
    p.add_argument("--serve-tls-cert", metavar="F", help="with --serve: serve over HTTPS")
    p.add_argument("--serve-tls-key", metavar="F", help="the certificate's private key")


def serve_flags_alone(args: Any) -> list[str]:
    """The serving options given without --serve (a mistake worth saying)."""
    given = {"--serve-token-file": args.serve_token_file, "--serve-insecure": args.serve_insecure,
             "--serve-tls-cert": args.serve_tls_cert, "--serve-tls-key": args.serve_tls_key}
    return [flag for flag, value in given.items() if value]
