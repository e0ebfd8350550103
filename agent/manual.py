"""The parts of `tuimon-agent`'s manual that are not options: shown at the end of
`--help` and as sections of `tuimon-agent --print-man`."""

from __future__ import annotations

SECTIONS: dict[str, str] = {
    "Examples": """\
  tuimon-agent once                             # what this node's agent can read
  tuimon-agent run --listen 0.0.0.0:9477 --token-file /etc/tuimon/agent.token
  tuimon-agent sim --nodes 32 --scenario spine-imbalance""",
    "Exit status": """\
  0    a clean exit; once: the node was read
  1    once: nothing could be read; sim: a port in use
  2    a usage error (a bad option, token, TLS or address): the message says which
  130  interrupted
  141  once: the reader of standard output went away (`| head -1`), as SIGPIPE""",
    "Files": """\
  /run/tuimon/steps.sock               training step datagrams from the job's ranks, when
                                       /run/tuimon exists (else
                                       $XDG_RUNTIME_DIR/tuimon-steps.sock, else
                                       /tmp/tuimon-steps.sock); --steps-socket to choose""",
    "Environment": """\
  TUIMON_STEPS_SOCKET  the step socket's path, for the agent and the job's ranks alike
  XDG_RUNTIME_DIR      where the step socket goes without /run/tuimon""",
    "See also": "tuimon(1); docs/operations.md and docs/protocol.md in the source tree.",
}
