"""Where frames come from (agents, later relays, Prometheus, recordings); no textual."""
