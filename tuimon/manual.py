"""The parts of `tuimon`'s manual that are not options: shown at the end of `--help` and
as sections of `tuimon --print-man`."""

from __future__ import annotations

SECTIONS: dict[str, str] = {
    "Examples": """\
  tuimon demo                                  # a simulated cluster, to look around
  tuimon connect 'gpu[001-128]:9477' --topology /etc/slurm/topology.conf
  tuimon connect --relay login1:9478 --token-file ~/.tuimon/token
  tuimon prom http://prometheus:9090 --match 'cluster="a"'
  tuimon prom http://prometheus:9090 --topology topology.conf --serve 127.0.0.1:9479
  tuimon status --relay login1 --since 6h      # the incidents the relay kept
  tuimon status 'gpu[001-128]:9477' --json; echo $?
  tuimon report --relay login1 --job llm-pretrain -o llm-pretrain.html
  tuimon rules --slo-target 0.9 --slo-days 30 > /etc/prometheus/rules/tuimon.yml
  tuimon --cluster prod                        # what the config file says of prod""",
    "Exit status": """\
  0    ok: every node answered and nothing was found (status, --once), or a clean exit
  1    warning (status, --once): a job burning its budget at a ticket rate, a GPU
       throttling, symbol errors, congestion
  2    critical (status, --once): a node down or lost, a lost GPU, a page-rate burn;
       or, for any command but status, a usage error: the message says what to type
  3    unknown (status, --once): no node was reached, nothing was checked; (status) a
       usage error (a monitoring system's UNKNOWN: the check is wrong, not the cluster);
       (report): the relay could not be read, or its ledger counts no such job
  129  the terminal hung up (the app or the plain readout; a connection dropped), as
       SIGHUP, whether or not the signal reached it
  130  interrupted
  141  the reader of standard output went away (`tuimon status | head -1`), as SIGPIPE""",
    "Files": """\
  $XDG_CONFIG_HOME/tuimon/config.toml     clusters: targets, relay, prometheus, SLO
  $XDG_CONFIG_HOME/tuimon/themes/*.toml   your own themes (heat-0 .. heat-8 and more)
  $STATE_DIRECTORY/ledger.db              the relay's SLO ledger under systemd, else
  $XDG_STATE_HOME/tuimon/ledger.db        (default ~/.local/state/tuimon/ledger.db)""",
    "Environment": """\
  NO_COLOR         no colours: the heat scale is still read from the cell glyphs
  XDG_CONFIG_HOME  where the config file and themes are (default ~/.config)
  XDG_STATE_HOME   where the relay keeps its ledger when systemd gives none""",
    "See also": "tuimon-agent(1); docs/operations.md, docs/protocol.md and "
                "docs/metrics.md in the source tree.",
}
