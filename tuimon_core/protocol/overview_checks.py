"""The overview's check, and the first form's upgrade: what a reader does with a node's
`overview` before anything reads it (the codec calls check_overview for every sample).

Every length is bounded and every number's range checked, so a view can index and colour
with what it holds and nothing else. Hot path (every node, every second, in every
viewer): sequences are checked whole with C-level calls, not element by element. An
overview of the first form (levels as maps, file systems as maps: agents that predate
form 2) is checked as it was and turned into form 2, the one the views read. Where each
value lies is the layout's (`overview_layout.py`, beside this file).
"""

from __future__ import annotations

import math
from typing import Any

from tuimon_core.protocol.errors import ProtocolError
from tuimon_core.protocol.fields import (
    FS_COLUMNS,
    FS_ROW_FIELDS,
    MAX_GPUS,
    MAX_PORTS,
    MAX_SHARED_FS,
)
from tuimon_core.protocol.overview_layout import (
    BUSY,
    BUSY_BYTES,
    FABRIC_LEVELS,
    FIRST_FORM_FS,
    FIRST_FORM_LEVELS,
    FS_ROWS,
    GPU_LEVELS,
    LEVEL_BYTES,
    MAX_WHO,
    MAX_WHO_LEN,
    PORTS,
    SECTIONS,
    WAIT,
    WHO,
    row_of_map,
    section_blob,
)
from tuimon_core.protocol.schema import MAX_NUM, MAX_STR, Record, Str, show, unknown_value
from tuimon_core.protocol.text import clean

# A level section -> the most cells a run of it holds.
_CELLS = {GPU_LEVELS: MAX_GPUS, FABRIC_LEVELS: MAX_PORTS}


def check_overview(ov: Any) -> None:
    """The overview family: level blobs, percents, port names, waits, file systems,
    checked (and the first form upgraded) in place; ProtocolError says what is wrong."""
    if type(ov) is not dict:
        raise ProtocolError(f"sample.overview: expected a map, got {show(ov)}")
    for key, limit in _CELLS.items():
        blob = ov.get(key)
        if blob is not None and not _is_level_blob(blob, limit):
            raise ProtocolError(f"sample.overview.{key}: expected a count of metrics, then "
                                f"that many runs of at most {limit} level bytes (0..10)")
    if "gpu" in ov or "fabric" in ov:
        _first_form_levels(ov)
    busy = ov.get(BUSY)
    if busy is not None and not (type(busy) is bytes and len(busy) <= MAX_GPUS and
                                 not busy.translate(None, BUSY_BYTES)):
        raise ProtocolError("sample.overview.busy: expected one byte per GPU, a percent "
                            "(0..100) or 255 (unknown)")
    ports = ov.get(PORTS)
    if ports is not None:
        try:  # joined in C: a non-string fails here, and one check covers every name
            names = "".join(ports) if type(ports) is list else None
        except TypeError:
            names = None
        if names is None or len(ports) > MAX_PORTS or (
                ports and max(map(len, ports)) > MAX_STR):
            raise ProtocolError("sample.overview.ports: expected a list of port names")
        if not names.isprintable():
            ov[PORTS] = [clean(p) for p in ports]
    wait = ov.get(WAIT)
    if wait is not None and not _is_waits(wait):
        raise ProtocolError("sample.overview.wait: expected a list of non-negative numbers")
    rows = ov.get(FS_ROWS)
    if rows is not None:
        if type(rows) is not list or len(rows) > MAX_SHARED_FS:
            raise ProtocolError(f"sample.overview.fs_rows: expected a list of at most "
                                f"{MAX_SHARED_FS} rows")
        for i, row in enumerate(rows):
            if type(row) is not list or len(row) < _FS_WIDTH:
                raise ProtocolError(f"sample.overview.fs_rows[{i}]: expected a row "
                                    f"[{', '.join(FS_COLUMNS)}]")
            if len(row) > _FS_WIDTH:
                rows[i] = row = row[:_FS_WIDTH]  # a newer agent's columns
            if not _plain_row(row):
                _check_row(row, f"sample.overview.fs_rows[{i}]")  # says what is wrong
    names = ov.get(WHO)
    if names is not None:
        try:
            joined = "".join(names) if type(names) is list else None
        except TypeError:
            joined = None
        if joined is None or len(names) > MAX_WHO or (
                names and max(map(len, names)) > MAX_WHO_LEN):
            raise ProtocolError(f"sample.overview.who: expected a list of at most {MAX_WHO} "
                                f"names of at most {MAX_WHO_LEN} characters")
        if not joined.isprintable():
            ov[WHO] = [clean(n) for n in names]
    if FIRST_FORM_FS in ov:
        _first_form_fs(ov)
    if not ov.keys() <= SECTIONS:
        for key in [k for k in ov if k not in SECTIONS]:
            # a newer agent's section
            ov[clean(key)] = unknown_value(ov.pop(key), f"sample.overview.{key}", 2)


def _is_level_blob(blob: Any, limit: int) -> bool:
    """A count k >= 1, then k runs of equal length <= limit, every byte a level (0..10).
    The count is removed with the levels when it is <= 10; a larger one is what is left."""
    if type(blob) is not bytes or not blob or blob[0] == 0:
        return False
    k = blob[0]
    cells, rest = divmod(len(blob) - 1, k)
    if rest or cells > limit:
        return False
    # Deleting every valid byte leaves nothing: one C pass per check, not a loop.
    left = blob.translate(None, LEVEL_BYTES)
    return not left or left == blob[:1]


# -- the first form -------------------------------------------------------------------


def _first_form_levels(ov: dict[str, Any]) -> None:
    """`gpu` and `fabric` as maps of metric to level bytes (agents of the first overview
    form): checked, then made the blobs the views read."""
    for section, key in FIRST_FORM_LEVELS.items():
        levels = ov.pop(section, None)
        if levels is None:
            continue
        limit = _CELLS[key]
        if type(levels) is not dict or len(levels) > 64:
            raise ProtocolError(f"sample.overview.{section}: expected a map of metric to "
                                "levels")
        if not _all_levels(levels, limit):  # all metrics at once; then say which one
            for metric, values in levels.items():
                if type(metric) is not str or not _all_levels({metric: values}, limit):
                    raise ProtocolError(f"sample.overview.{section}.{show(metric)}: expected "
                                        f"at most {limit} level bytes (0..10)")
        # A metric the agent did not send is no data (level byte 0) in every cell.
        ov[key] = section_blob(key, levels)


def _first_form_fs(ov: dict[str, Any]) -> None:
    """`fs` as a list of maps (agents of the first overview form): checked, then made the
    rows the views read."""
    fs = ov.pop(FIRST_FORM_FS)
    if type(fs) is not list or len(fs) > MAX_SHARED_FS:
        raise ProtocolError(f"sample.overview.fs: expected a list of at most "
                            f"{MAX_SHARED_FS} maps")
    for i, f in enumerate(fs):
        if type(f) is not dict or type(f.get("id")) is not str:
            raise ProtocolError(f"sample.overview.fs[{i}]: expected a map with a string "
                                "'id'")
        if not _plain_fs(f):
            _FS_ROW.check(f, f"sample.overview.fs[{i}]")  # cleans, or says what is wrong
        fs[i] = row_of_map(f)
    ov[FS_ROWS] = fs


# -- file system rows -----------------------------------------------------------------

_FS_WIDTH = len(FS_COLUMNS)
_FS_ROW = Record("file system row", FS_ROW_FIELDS)
# The row's text columns (id, fstype) and their bounds; every other column is a
# non-negative number or nil (the schema's RATE).
_ROW_TEXT = tuple((i, f.type.max_len) for i, f in enumerate(FS_ROW_FIELDS)
                  if isinstance(f.type, Str))
_ROW_NUMBERS = tuple(i for i, f in enumerate(FS_ROW_FIELDS) if not isinstance(f.type, Str))
# An overview's file system as agents build it: printable keys known in advance.
_FS_KEYS = frozenset(FS_COLUMNS)


def _plain_row(row: list[Any]) -> bool:
    """A file system's row as every agent sends it: printable text of bounded length in
    the text columns, finite non-negative numbers or nil in the rest."""
    for i, limit in _ROW_TEXT:
        v = row[i]
        if v is None:
            if i == 0:
                return False
        elif type(v) is not str or len(v) > limit or not v.isprintable():
            return False
    for i in _ROW_NUMBERS:
        v = row[i]
        t = type(v)
        if t is int or t is float:
            if not 0 <= v <= MAX_NUM:  # NaN fails too
                return False
        elif v is not None:
            return False
    return True


def _check_row(row: list[Any], where: str) -> None:
    """A row that is not plain: its strings cleaned in place, or what is wrong said."""
    for c, field in enumerate(FS_ROW_FIELDS):
        v = row[c]
        if v is None:
            if field.required:
                raise ProtocolError(f"{where}.{field.key}: required {field.type.words}, "
                                    "got nil")
            continue
        row[c] = field.type.check(v, f"{where}.{field.key}")


def _plain_fs(f: dict[Any, Any]) -> bool:
    """A shared file system of the overview's first form with only the known keys and
    plain values: true for every agent's, so the full check (which cleans and says what
    is wrong) runs only for what is not."""
    return _FS_KEYS.issuperset(f) and _plain_row(row_of_map(f))


# -- levels and waits -----------------------------------------------------------------

_NUM_OR_NIL: frozenset[type] = frozenset({int, float, type(None)})
_INT_ONLY = {int}


def _all_levels(levels: dict[Any, Any], limit: int) -> bool:
    """metric -> bytes, each at most `limit` long, every byte a level (0..10)."""
    for metric, data in levels.items():
        if type(data) is not bytes or type(metric) is not str or len(data) > limit:
            return False
    return not b"".join(levels.values()).translate(None, LEVEL_BYTES)


def _is_waits(values: Any) -> bool:
    """Port waits: a list of at most MAX_PORTS finite numbers >= 0, nil allowed."""
    if type(values) is not list or len(values) > MAX_PORTS:
        return False
    types = set(map(type, values))
    if types == _INT_ONLY:  # the usual case: counter rates as whole ticks
        return min(values) >= 0 and max(values) <= MAX_NUM
    if not types <= _NUM_OR_NIL:
        return False
    if None in values:
        values = [v for v in values if v is not None]
    return not values or (all(map(math.isfinite, values)) and min(values) >= 0
                          and max(values) <= MAX_NUM)
