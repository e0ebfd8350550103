"""Default ports: the agent's, the relay's and the headless judge's (`tuimon prom --serve`)."""

DEFAULT_PORT = 9477  # tuimon-agent run
DEFAULT_RELAY_PORT = 9478  # tuimon relay
DEFAULT_JUDGE_PORT = 9479  # tuimon prom URL --serve
