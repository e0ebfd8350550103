"""How long a one-shot `tuimon status` waits before it judges, and the words `--help`
says it in: kept apart from tuimon.status so the command line can say it without
loading the viewer."""

from __future__ import annotations

from tuimon_core.findings import LONGEST_HOLD_S

FIRST_VERDICT_S = 5.0  # at most this long for every node's first two samples
STEPS_WAIT_S = 5.0  # and then at most this long for step sums from every reporting node
# (or for the first ones, where a node runs a GPU process and none reports yet)
HOLD_WAIT_S = LONGEST_HOLD_S  # and then at most this long for held conditions to be raised
RELAY_JUDGEMENT_S = 5.0  # through relays: at most this long for their judgement
WAITS = (f"A one-shot status waits for two samples from every node (at most "
         f"{FIRST_VERDICT_S:g} s), for step sums twice from nodes that report training steps "
         f"(or, where none does yet, for the first ones while a node runs a GPU process; at "
         f"most {STEPS_WAIT_S:g} s more) and for a condition being held before it shows "
         f"(at most {HOLD_WAIT_S:g} s more), so it says what the app, watching, says. "
         f"Through relays that judge their nodes it shows their judgement instead, held "
         f"from the true onsets, as soon as it comes (at most {RELAY_JUDGEMENT_S:g} s).")
