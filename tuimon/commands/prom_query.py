"""What to ask a Prometheus server and how to name its nodes: the options `prom` and
`status --prometheus` share, and the `PromOptions` they make (checked: no token in
clear text off loopback, label names PromQL takes)."""

from __future__ import annotations

import argparse
import re
from typing import Any
from urllib.parse import urlsplit

from tuimon.sources.targets import TargetError
from tuimon_core.cli_types import header_value, positive_float
from tuimon_core.serving.security import (
    check_token_transport,
    client_ssl_context,
    load_token,
)


def prom_query_options(p: argparse.ArgumentParser) -> None:
    """What to ask a Prometheus server and how to name its nodes: prom and status."""
    p.add_argument("--match", default="", metavar="MATCHERS",
                   help="Prometheus: label matchers added to every query, e.g. "
                        "'cluster=\"prod\"'")
    p.add_argument("--node-label", action="append", default=[], metavar="LABEL",
                   help="Prometheus: a label that names the node, tried before the built-in "
                        "order (node, kubernetes_node, Hostname, node_exporter's uname, the "
                        "instance's host); repeatable")
    p.add_argument("--node-alias", action="append", default=[], metavar="NAME=NODE",
                   help="Prometheus: call what resolves to NAME by NODE instead (e.g. an "
                        "exporter's address); repeatable")
    p.add_argument("--timeout", type=positive_float(600.0), default=10.0, metavar="S",
                   help="Prometheus: seconds each query may take (default 10); a slow "
                        "answer to the live queries fails the refresh, to the others is "
                        "asked again at the next one")
    p.add_argument("--tenant", metavar="ID", type=header_value,
                   help="Prometheus: the tenant to ask (sent as X-Scope-OrgID, as Grafana "
                        "Mimir and Cortex require)")
    p.add_argument("--recorded", action="store_true",
                   help="Prometheus: read the records of `tuimon rules --live` (loaded on "
                        "the server, same --match and --node-label) instead of evaluating "
                        "the live queries at every refresh")


def node_labels(labels: list[str]) -> None:
    for label in labels:
        # It goes into every query's `by (...)`: a name PromQL takes unquoted.
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", label):
            raise TargetError(f"--node-label {label!r}: expected a label name of letters, "
                              "digits and underscores (relabel it so on the server)")


def prom_options(args: argparse.Namespace) -> Any:
    from tuimon.sources.prometheus import PromOptions

    if not args.url.startswith(("http://", "https://")):
        raise TargetError(f"prometheus URL {args.url!r}: expected http://HOST:PORT or "
                          "https://...")
    ssl_ctx = (client_ssl_context(args.tls_ca, args.tls_insecure)
               if args.tls_ca or args.tls_insecure else None)
    node_labels(args.node_label)
    match = args.match
    from tuimon.sources.prom_live_rules import selector

    try:  # as PromQL reads it inside braces, given with them or not
        match = selector(args.match)
    except ValueError as exc:
        if args.recorded:  # the records are selected by the labels it names
            raise TargetError(f"--match with --recorded: {exc}") from None
    aliases = {}
    for item in args.node_alias:
        name, sep, node = item.partition("=")
        if not sep or not name or not node:
            raise TargetError(f"--node-alias {item!r}: expected NAME=NODE")
        aliases[name] = node
    token = load_token(args.token_file) if args.token_file else None
    if args.url.startswith("http://"):
        # The same rule as for agents and relays: no token in clear off loopback.
        server = urlsplit(args.url).netloc.rsplit("@", 1)[-1]
        check_token_transport([server], token, False, args.insecure,
                              tls_flag="an https:// URL")
    return PromOptions(token=token, tenant=args.tenant, timeout=args.timeout,
                       ssl_context=ssl_ctx, match=match, every=args.every,
                       slo_hours=args.slo_hours, node_labels=list(args.node_label),
                       node_aliases=aliases, recorded=args.recorded)
