"""How a viewer reaches what it watches: the agents and relays the options name, with
the token and TLS they give (checked against where they go), for connect, status and
report."""

from __future__ import annotations

import argparse
import ssl
import sys

from tuimon.sources.agent_stream import StreamOptions
from tuimon.sources.targets import (
    TargetError,
    expand_hostlists,
    parse_targets,
    read_targets_file,
)
from tuimon_core.ports import DEFAULT_RELAY_PORT
from tuimon_core.protocol import Subscribe
from tuimon_core.protocol.overview_layout import OVERVIEW_FORM
from tuimon_core.serving.security import (
    check_token_transport,
    client_ssl_context,
    load_token,
)

# More agents than this watched directly (no relay) is said before it is done.
MANY_DIRECT = 8192


def connect_options(args: argparse.Namespace) -> tuple[list[str], list[str], StreamOptions]:
    """(agents, relays, how to reach them)."""
    items = list(args.targets)
    if args.targets_file:
        items += read_targets_file(args.targets_file)
    # `http://host:port` (as a browser or curl would have it) means host:port; https and
    # wss mean TLS too.
    if any(str(i).startswith(("https://", "wss://")) for i in [*items, *args.relay]):
        args.tls = True
    items = [strip_scheme(i) for i in items]
    targets = parse_targets(items)
    relays = parse_targets([strip_scheme(r) for r in args.relay], DEFAULT_RELAY_PORT)
    if not targets and not relays:
        raise TargetError("no targets: give host[:port] arguments, --relay HOST or "
                          "--targets-file" + (", or --prometheus URL"
                                              if args.command == "status" else ""))
    if len(targets) > MANY_DIRECT:
        # Taken, but said: a typo in a host list (`gpu[1-100000]`) or a cluster that
        # wants a relay in front of it.
        note = (f"watching {len(targets):,} agents directly: each is a connection and a "
                f"frame a second to this viewer; beyond a few thousand put a relay in front "
                f"(tuimon relay) and give --relay")
        print(f"tuimon: {note}", file=sys.stderr)
        args.notes = [*getattr(args, "notes", []), note]  # and the app says it on screen
    token, ssl_ctx = credentials(args, [*targets, *relays])
    subscribe = None
    if args.nodes or args.families or args.every:
        families = ([f.strip() for f in args.families.split(",") if f.strip()]
                    if args.families else None)
        expand_hostlists(args.nodes or [])  # a bad host list is an error here, not on the relay
        subscribe = Subscribe(interval=args.every, families=families, nodes=args.nodes,
                              overview_form=OVERVIEW_FORM)
    return targets, relays, StreamOptions(token=token, ssl_context=ssl_ctx,
                                          subscribe=subscribe)


def credentials(args: argparse.Namespace, addresses: list[str]
                ) -> tuple[str | None, ssl.SSLContext | None]:
    """The token and TLS context the options give, checked against where they go (no
    token in clear text off loopback)."""
    token = load_token(args.token_file) if args.token_file else None
    ssl_ctx = (client_ssl_context(args.tls_ca, args.tls_insecure)
               if args.tls or args.tls_ca or args.tls_insecure else None)
    check_token_transport(addresses, token, ssl_ctx is not None, args.insecure)
    return token, ssl_ctx


def relay_of(args: argparse.Namespace) -> tuple[str, StreamOptions]:
    """The one relay `--relay` names (host:port), and how to reach it."""
    if not args.relay:
        raise TargetError(f"{args.command}: give --relay HOST[:PORT], the relay that keeps "
                          "the run's ledger")
    if args.relay.startswith(("https://", "wss://")):
        args.tls = True
    relays = parse_targets([strip_scheme(args.relay)], DEFAULT_RELAY_PORT)
    if len(relays) != 1:
        raise TargetError(f"--relay {args.relay!r}: one relay, HOST[:PORT]")
    token, ssl_ctx = credentials(args, relays)
    return relays[0], StreamOptions(token=token, ssl_context=ssl_ctx)


def strip_scheme(item: str) -> str:
    for scheme in ("https://", "http://", "wss://", "ws://"):
        if item.startswith(scheme):
            return item[len(scheme):].split("/", 1)[0]
    return item
