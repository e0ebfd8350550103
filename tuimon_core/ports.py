"""Default ports: the agent's and the relay's."""

DEFAULT_PORT = 9477  # tuimon-agent run
DEFAULT_RELAY_PORT = 9478  # tuimon relay
