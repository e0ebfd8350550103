"""How often the relay sends each viewer a batch: a module of its own, so that `tuimon
relay`'s options (listed by every `tuimon` command's parser) read it without loading the
relay's server."""

from __future__ import annotations

# Seconds between batches to a viewer that asks for nothing slower (`--interval`): the
# one default the relay's command, its configuration and its state take.
BATCH_EVERY_S = 0.25
