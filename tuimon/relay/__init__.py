"""The login-node relay: fan-in from many agents (or relays), fan-out of batches to many
viewers, and the run's SLO ledger.

As a command: `tuimon relay TARGET...`. Inside an existing asyncio program:

    from tuimon.relay import Relay, RelayConfig

    config = RelayConfig(targets=["gpu[001-128]:9477"], ledger="/var/lib/tuimon/ledger.db")
    async with Relay(config) as relay:
        print("viewers connect to", relay.url)
        ...

Leaving the block (or `await relay.stop()`) closes the viewers' streams, stops every
upstream connection, writes the ledger's last buckets and awaits every task.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuimon.relay.ledger import LedgerError
    from tuimon.relay.relay import Relay, RelayConfig, build_relay
    from tuimon_core.ports import DEFAULT_RELAY_PORT

__all__ = ["DEFAULT_RELAY_PORT", "LedgerError", "Relay", "RelayConfig", "build_relay"]

# Each name's module, loaded when the name is first read: the relay's server (aiohttp's
# web side, the ledger, the judge) is not loaded by every `tuimon` command whose parser
# lists `relay`'s options (the command imports it when it runs).
_HOMES = {"Relay": "tuimon.relay.relay", "RelayConfig": "tuimon.relay.relay",
          "build_relay": "tuimon.relay.relay", "LedgerError": "tuimon.relay.ledger",
          "DEFAULT_RELAY_PORT": "tuimon_core.ports"}


if not TYPE_CHECKING:  # for mypy the names above are the package's; a misspelt one fails
    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # read once: the next read is a plain attribute
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
