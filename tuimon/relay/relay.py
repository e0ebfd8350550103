"""The relay as one object: its configuration, its aiohttp application and state
(`build_relay`), and `Relay`, the service an asyncio program starts and stops (the
package's docstring shows how). Imported on first use through the package: `tuimon
relay`'s options and every other command start without the relay's server."""

from __future__ import annotations

import dataclasses
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from tuimon.model.judge_config import JudgeConfig
from tuimon.model.slo import DEFAULT_HOURS, Slo
from tuimon.relay.cadence import BATCH_EVERY_S
from tuimon.relay.fanout import FanOut
from tuimon.relay.judging import RelayJudge
from tuimon.relay.ledger import Ledger
from tuimon.relay.server import RelayState, build_relay_app
from tuimon.sources.agent_stream import StreamOptions
from tuimon.sources.targets import parse_targets
from tuimon_core.ports import DEFAULT_RELAY_PORT
from tuimon_core.serving.security import (
    ConfigError,
    check_bind_rule,
    check_token_transport,
    parse_listen,
)
from tuimon_core.serving.service import Service


@dataclass
class RelayConfig:
    # Agents: host[:port] or Slurm host lists, as for `tuimon connect`.
    targets: list[str] = field(default_factory=list)
    # Upstream relays (a relay of relays): they may speak for the nodes they declare.
    relays: list[str] = field(default_factory=list)
    listen: str = f"127.0.0.1:{DEFAULT_RELAY_PORT}"
    name: str = "relay"
    # SQLite file of the SLO ledger; None: no ledger (viewers count from their start).
    ledger: str | Path | None = None
    ledger_keep_days: float = 30.0
    ledger_max_bytes: int | None = None
    slo_hours: float = DEFAULT_HOURS
    # A job silent longer than this has ended: its silence is not counted as `stopped`.
    stopped_most_h: float = 24.0
    # Seconds between batches to a viewer that asks for nothing slower.
    interval: float = BATCH_EVERY_S
    flush_every: float = 10.0
    budget_every: float = 5.0
    max_viewers: int = 256
    # Viewers must send this bearer token (required off loopback unless insecure).
    token: str | None = None
    insecure: bool = False
    ssl_context: ssl.SSLContext | None = None
    # How the relay reaches its upstream agents: their token and TLS.
    upstream_token: str | None = None
    upstream_ssl: ssl.SSLContext | None = None
    # Send the upstream token over plain HTTP to non-loopback targets anyway.
    upstream_insecure: bool = False
    upstream_backoff: tuple[float, float] = field(default=(0.5, 30.0))
    # What the relay judges its nodes with (topology, provisioned throughput, the SLO's
    # target and the jobs' baselines): as a viewer given the same options would.
    judge: JudgeConfig = field(default_factory=JudgeConfig)


def build_relay(config: RelayConfig) -> tuple[web.Application, RelayState]:
    """The relay's aiohttp application (for `web.run_app` or `Service`) and its state."""
    targets = parse_targets(config.targets)
    relays = parse_targets(config.relays, DEFAULT_RELAY_PORT)
    if not targets and not relays:
        raise ConfigError("the relay needs at least one target: agents (host[:port], "
                          "gpu[001-128]:9477), --targets-file F, or --relay for upstream relays")
    check_token_transport([*targets, *relays], config.upstream_token,
                          config.upstream_ssl is not None, config.upstream_insecure,
                          "--upstream-tls", "--upstream-insecure")
    if not 0.05 <= config.interval <= 60:
        raise ConfigError(f"relay interval must be in [0.05, 60] s, got {config.interval}")
    ledger = None
    if config.ledger is not None:
        ledger = Ledger(config.ledger, keep_days=config.ledger_keep_days,
                        window_hours=config.slo_hours, max_bytes=config.ledger_max_bytes,
                        stopped_most_h=config.stopped_most_h)
    judge_config = dataclasses.replace(config.judge, slo=Slo(config.judge.slo.target,
                                                             config.slo_hours))
    fanout = FanOut(on_steps=ledger.add if ledger is not None else None,
                    on_totals=ledger.add_totals if ledger is not None else None,
                    on_ended=ledger.ended if ledger is not None else None,
                    judge=RelayJudge(judge_config))
    # Every frame checked whole, as a viewer checks it: the relay's judgement reads them.
    upstream = StreamOptions(token=config.upstream_token, ssl_context=config.upstream_ssl,
                             min_backoff=config.upstream_backoff[0],
                             max_backoff=config.upstream_backoff[1], deep_checks=True,
                             overview=True)
    state = RelayState(name=config.name, targets=targets, relays=relays, upstream=upstream,
                       fanout=fanout,
                       ledger=ledger, interval=config.interval, max_viewers=config.max_viewers,
                       budget_every=config.budget_every, flush_every=config.flush_every,
                       token=config.token)
    return build_relay_app(state), state


class Relay(Service):
    """A relay on the caller's event loop."""

    def __init__(self, config: RelayConfig) -> None:
        address = parse_listen(config.listen, DEFAULT_RELAY_PORT)
        check_bind_rule(address, config.token, config.insecure)
        app, self.state = build_relay(config)
        super().__init__(app, address, config.ssl_context)
