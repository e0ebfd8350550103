"""The agent's (and the wire protocol implementation's) release version."""

__version__ = "0.1.0"
