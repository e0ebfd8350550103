"""Reading the records of `tuimon rules --live` (--recorded) instead of evaluating the
queries they record: their answers read as the queries' own, an inventory record with
no series replaced by its query's answer, and whether a refresh may stand on what the
last one read (the records unchanged since)."""

from __future__ import annotations

import logging
import math
from typing import Any

from tuimon.sources import prom_live_rules as live_rules
from tuimon.sources import prom_queries as q
from tuimon.sources.prom_answers import Series
from tuimon.sources.prom_client import PromClient, PromError

log = logging.getLogger("tuimon.sources.prometheus")

# The longest a --recorded refresh finds the records as they were before it reads them
# anyway (the rules' longest interval): records that stopped being evaluated hold the
# failed scrapes, the file systems and the jobs no longer than this.
STAND_MAX_S = live_rules.EVERY_S[1]


class RecordReading:
    def __init__(self, client: PromClient, match: str, ids: tuple[str, ...],
                 recorded: bool) -> None:
        self.client = client
        self.match = match
        # An inventory query -> its record's query, and the PromQL the record stands
        # for, asked where the record has no series (gpu_drawn's of every field, as
        # recorded: whatever fields the map draws when it answers); the records said
        # missing.
        self.inventory = live_rules.recorded_inventory(match, ids) if recorded else {}
        self._unrecorded = {n: q.render(live_rules.inventory_query(n), match, ids)
                            for n in self.inventory}
        self.said_unrecorded: set[str] = set()
        # Did each inventory query's last answer come from its record (up to its
        # interval old), not from the series?
        self.answered_by_record: dict[str, bool] = {}
        # After a refresh that read the records: when the server last evaluated them,
        # what the refresh asked (the fields, the queries left out, the nodes asked
        # whole) and when it began. None where the next refresh must read.
        self.read: tuple[dict[str, float], Any, float] | None = None
        # While refreshes stand to wait for the rest of an evaluation (stands): how many
        # have, how many may, and the newest evaluation time when the wait began.
        self._waited: tuple[int, int, float] | None = None
        self.probes: dict[str, dict[str, str]] = {}  # prom_live_rules.evaluated_query
        self._said_old_rules = False

    def totals_recorded(self) -> bool:
        """Did the GPUs' totals last come from their records (up to their interval old)?"""
        return any(self.answered_by_record.get(n) for n in q.TOTALS)

    async def as_query(self, name: str, answer: Series) -> Series:
        """An optional query's answer, as the query's own: an inventory record's series
        names restored, and one with no series replaced by the query's."""
        unrecorded = self._unrecorded.get(name)
        if unrecorded is None:
            return answer
        self.answered_by_record[name] = bool(answer)
        if not answer:
            return await self._unrecorded_answer(name, unrecorded)
        live_rules.restore_names(answer)
        return answer

    async def _unrecorded_answer(self, name: str, promql: str) -> Series:
        """An inventory record with no series: the query it records asked instead (rules
        of an older tuimon, without the inventory's group; or a group loaded and not
        evaluated yet, up to a minute). Said once, where the query finds what the record
        lacks (an answer both leave empty is no news: no node has such a series)."""
        answer = await self.client.query(promql, name)
        if answer and name not in self.said_unrecorded:
            self.said_unrecorded.add(name)
            log.warning("prometheus %s: no series %s, though the series it records answer: "
                        "the inventory's group of `tuimon rules --live` is not loaded (rules "
                        "of an older tuimon) or not evaluated yet; read from the series "
                        "meanwhile", self.client.url, live_rules.inventory_name(name))
        return answer

    async def evaluated(self) -> dict[str, float] | None:
        """When the server last evaluated each record the last read read (by record: a
        read between the first and the last of a group's finds some old, and one whose
        rule fails keeps its old time while the others move on). None: unknown, or a
        series that told it is gone (its node: the next read finds others)."""
        promql = live_rules.evaluated_query(self.match, self.probes)
        if not promql:
            return None
        try:
            answer = await self.client.query(promql, "evaluated")
        except PromError as exc:
            log.debug("%s (the records' evaluation time)", exc)
            return None
        label = live_rules.RECORD_LABEL
        times = {labels[label]: value for labels, value in answer if label in labels}
        return times if times.keys() == self.probes.keys() else None

    def stands(self, evaluated: dict[str, float] | None, asked: Any, now: float,
               every: float, nothing_else: bool) -> bool:
        """Does this refresh find every record as the last one read it, with nothing
        else to read now (`nothing_else`: every query it plans is a live one or goes
        beside)? Then the values are as they were, and reading and assembling every
        node's series again (a third of a core at 4096 nodes) would say nothing new: the
        records change once per evaluation interval (`tuimon rules --live --every`),
        whatever the refresh's. Not so where the view `asked` other fields or nodes, an
        open screen's detail is read, or a node has jobs; and never longer than
        STAND_MAX_S (records that stopped: a ruler down or failing). What runs beside
        (the inventory, the budget, the error counters) is taken up by the next refresh
        that reads.

        Where some records were evaluated since the last read and others not yet, the
        refresh stands too (`_waited`): a group's records are stored one after another,
        seconds apart at thousands of nodes (5-7 s at 4096), so a read now would read the
        evaluation twice, half of it old. It waits for the records of the newest
        evaluation that were level with the newest at the last read, for as many
        refreshes as fit before the next evaluation (the interval between the two reads'
        newest times, in whole refreshes of `every` seconds, less one: none where the
        rules run as often as the refreshes, or less often), set when the wait begins,
        and not once a newer evaluation shows (waiting on would chase it). One behind at
        the last read is stuck (its rule failing) and waited for no more."""
        read = self.read
        waited, self._waited = self._waited, None
        if not (evaluated is not None and read is not None and read[1] == asked
                and now - read[2] < STAND_MAX_S and nothing_else):
            return False
        last = read[0]
        if last == evaluated:
            return True
        newest, last_newest = max(evaluated.values()), max(last.values())
        if not any(t < newest and last.get(n) == last_newest for n, t in evaluated.items()):
            return False
        if waited is None:
            most = math.floor((newest - last_newest) / every) - 1
            waited = (0, most, newest)
        stood, most, began = waited
        if newest != began or stood >= most:
            return False
        self._waited = (stood + 1, most, began)
        return True

    def take(self, answers: dict[str, Series]) -> None:
        """The records' answers read as the queries' own; none at all is an error that
        says what to load (they are what the maps and the rules read)."""
        recorded = [answers.get(name, []) for name in live_rules.RECORDED]
        if not any(recorded):
            raise PromError(f"prometheus {self.client.url}: no series "
                            f"{live_rules.record_name('gpu')} or the other records "
                            "--recorded reads: load the rules `tuimon rules --live` writes "
                            "(with this --match and --node-label), or leave out --recorded")
        self.warn_old_rules(answers.get("ib_errors", []))
        # A series of each record read every refresh, as it answered (its own labels):
        # what the next refresh asks the evaluation time of.
        self.probes = {name: dict(answers[name][0][0]) for name in live_rules.RECORDED
                       if answers.get(name) and name != "ib_errors"}
        for series in recorded:
            live_rules.restore_names(series)

    def warn_old_rules(self, errors: Series) -> None:
        """A record of the error counters without their names (rules of an older tuimon):
        said once, as it holds until the rules are written again."""
        if errors and live_rules.NAME_LABEL not in errors[0][0] and not self._said_old_rules:
            self._said_old_rules = True
            log.warning("prometheus %s: %s holds no counter names: rules of an older tuimon;"
                        " port errors go uncounted until `tuimon rules --live` is loaded "
                        "again", self.client.url, live_rules.record_name("ib_errors"))
