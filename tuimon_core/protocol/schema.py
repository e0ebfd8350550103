"""The wire's types: what each field may hold, checked by readers and fitted by senders.

Every field of every message and family is declared once, in the name table
(`tuimon_core/protocol/fields.py`), with one of these types. The decoder checks each
value against its type (`check`), so a frame that reaches a view holds only what the
views can use: numbers that are finite numbers, strings of bounded length made
printable, lists and maps of bounded size, records with their required keys. The agent
fits what it sends to the same types (`fit`: strings cleaned and cut, lists capped), so
its own frames always pass its peers' checks, whatever a machine holds (a 5,000-character
user name, 300 mounts, a mount path of escape characters).

A value that could not be read is nil (None) on the wire; every field may be nil unless
it is `required`. A record keeps the keys it does not know (a newer agent's fields),
their strings cleaned and their depth bounded, and never reads them.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from tuimon_core.protocol.errors import ProtocolError
from tuimon_core.protocol.text import clean

MAX_STR = 4096
# The largest magnitude of a `num` on the wire: far above any real value (bytes/s,
# joules, hertz), far below where sums over a cluster or a multiplication by a scale
# overflow a float. (A division by a valid value can still be infinite, 1 / 5e-324: a
# reader that divides guards it.)
MAX_NUM = 1e18
# Nesting of a value no record describes (a newer agent's field): deeper is refused.
MAX_UNKNOWN_DEPTH = 4
# A map key's length (a counter's, an operation's, a field's name) unless a map says.
MAX_KEY = 128
# Type codes a container checks inline (WireType.code).
NUM, INT, STR = 1, 2, 3
# A record holding at most one in this many of its keys is checked key by key (measured:
# a Prometheus GPU's three of 47 in a fifth of the time; the agent's full GPU is not).
SPARSE_SHARE = 4


_SHOW = reprlib.Repr()  # attributes, not keywords: Python 3.10 and 3.11
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict = 2, 40, 40, 4, 4


def show(v: Any) -> str:
    """A value as an error names it: its type and the start of its text (never all of
    it, nor all of its depth: a value nested a thousand deep is shown in a few levels)."""
    if v is None:
        return "nil"
    return f"{type(v).__name__} {_SHOW.repr(v)[:60]}"


class FieldLike(Protocol):
    """A field of a record: tuimon_core.protocol.fields.Field."""

    @property
    def key(self) -> str: ...
    @property
    def type(self) -> WireType: ...
    @property
    def required(self) -> bool: ...


class WireType:
    """One type of the wire. `doc` is how docs/protocol.md spells it, `words` how an error
    says what was expected."""

    __slots__ = ("code", "doc", "words")

    def __init__(self, doc: str, words: str, code: int = 0) -> None:
        self.doc = doc
        self.words = words
        # How a record checks a value of this type inline (hot path): NUM, INT or STR,
        # against the type's own bounds; 0: by calling check().
        self.code = code

    def check(self, v: Any, where: str) -> Any:
        """The value as a reader keeps it (strings cleaned), or ProtocolError. Never nil."""
        raise NotImplementedError

    def fit(self, v: Any) -> Any:
        """What a sender sends for `v`: cut to this type's bounds, or None where it
        cannot be (a string where a number belongs, a NaN)."""
        try:
            return self.check(v, "")
        except ProtocolError:
            return None

    def bad(self, v: Any, where: str) -> ProtocolError:
        return ProtocolError(f"{where}: expected {self.words}, got {show(v)}")


class Num(WireType):
    """A finite number (int or float, never a bool), within bounds where given."""

    __slots__ = ("above", "hi", "lo")

    def __init__(self, lo: float | None = None, hi: float | None = None, *,
                 above: float | None = None, doc: str | None = None) -> None:
        if doc is None:
            low = f"> {above:g}" if above is not None else (
                f">= {lo:g}" if lo is not None else "")
            doc = "num" + (f" {low}" if low else "") + (
                f" <= {hi:g}" if hi is not None else "")
        lo = -MAX_NUM if lo is None and above is None else lo
        hi = MAX_NUM if hi is None else hi
        low = f"> {above:g}" if above is not None else f">= {lo:g}"
        super().__init__(doc, f"a number {low} and <= {hi:g}", NUM)
        # Inline: `low <= v <= hi`, and `v > above` where given (then low is above).
        self.lo: float = lo if lo is not None else above  # type: ignore[assignment]
        self.hi: float = hi
        self.above = above

    def check(self, v: Any, where: str) -> Any:
        t = type(v)
        if (t is not float and t is not int) or not self.lo <= v <= self.hi or (
                self.above is not None and v <= self.above):  # NaN fails every comparison
            raise self.bad(v, where)
        return v


class Int(WireType):
    """A whole number (never a bool), >= lo (0 unless told) and <= hi where given."""

    __slots__ = ("hi", "lo")

    def __init__(self, lo: int = 0, hi: int | None = None, *, doc: str | None = None) -> None:
        self.lo, self.hi = lo, hi
        if doc is None:
            doc = "int" + (f" {lo}..{hi}" if hi is not None else (f" >= {lo}" if lo else ""))
        words = "a non-negative integer" if lo == 0 else f"an integer >= {lo}"
        super().__init__(doc, words + (f" <= {hi}" if hi is not None else ""), INT)

    def check(self, v: Any, where: str) -> Any:
        if type(v) is not int or v < self.lo or (self.hi is not None and v > self.hi):
            raise self.bad(v, where)
        return v


class Str(WireType):
    """A string of at most `max_len` characters, made printable (tuimon_core.protocol.text);
    one of `choices` where given."""

    __slots__ = ("choices", "max_len")

    def __init__(self, max_len: int = MAX_STR, *, choices: Iterable[str] | None = None,
                 doc: str | None = None) -> None:
        self.max_len = max_len
        self.choices = frozenset(choices) if choices is not None else None
        if doc is None:
            doc = "str" + (f" <= {max_len}" if max_len != MAX_STR else "")
        words = (f"one of {', '.join(sorted(self.choices))}" if self.choices is not None else
                 f"a string of at most {max_len} characters")
        super().__init__(doc, words, STR)

    def check(self, v: Any, where: str) -> Any:
        if type(v) is not str or len(v) > self.max_len:
            raise self.bad(v, where)
        if self.choices is not None and v not in self.choices:
            raise self.bad(v, where)
        return v if v.isprintable() else clean(v)

    def fit(self, v: Any) -> Any:
        if type(v) is not str:
            return None
        if not v.isprintable():
            v = clean(v)  # before the cut: escapes make a string longer
        if len(v) > self.max_len:
            v = v[:self.max_len - 1] + "\u2026"
        if self.choices is not None and v not in self.choices:
            return None
        return v


def _checked_in_place(v: dict[Any, Any], k: str, x: Any, t: WireType, where: str) -> None:
    """`v[k]` (`x`) checked by its type's own check (a map's value; in a record's check
    key by key, a list, a map or a record), the path added to an error; a value the
    check cleaned put in its place."""
    try:
        c = t.check(x, "")
    except ProtocolError as exc:
        raise exc.under(f"{where}.{k}") from None
    if c is not x:
        v[k] = c


class Bin(WireType):
    """A binary of at most `max_len` bytes."""

    __slots__ = ("max_len",)

    def __init__(self, max_len: int, *, doc: str = "bin") -> None:
        self.max_len = max_len
        super().__init__(doc, f"a binary of at most {max_len} bytes")

    def check(self, v: Any, where: str) -> Any:
        if type(v) is not bytes or len(v) > self.max_len:
            raise self.bad(v, where)
        return v


class ListOf(WireType):
    """A list of at most `max_items` values of one type (nil items only where `nil`)."""

    __slots__ = ("item", "max_items", "nil")

    def __init__(self, item: WireType, max_items: int, *, nil: bool = False,
                 doc: str | None = None) -> None:
        self.item, self.max_items, self.nil = item, max_items, nil
        super().__init__(doc or f"[{item.doc}] <= {max_items}",
                         f"a list of at most {max_items} items, each {item.words}"
                         + (" or nil" if nil else ""))

    def check(self, v: Any, where: str) -> Any:
        if type(v) is not list or len(v) > self.max_items:
            raise self.bad(v, where)
        item: Any = self.item  # its own bounds are read inline
        code = item.code
        if code == STR:  # strings: the usual case checked in C-level passes
            if item.choices is None and all(
                    type(x) is str and len(x) <= item.max_len
                    for x in v):
                return v if all(map(str.isprintable, v)) else [clean(x) for x in v]
        elif code == NUM and item.above is None and all(
                type(x) is float or type(x) is int for x in v) and (
                not v or (sum(v) - sum(v) == 0 and min(v) >= item.lo
                          and max(v) <= item.hi)):
            return v  # the sum is NaN where any item is: min and max skip NaN
        for i, x in enumerate(v):
            if x is None:
                if not self.nil:
                    raise ProtocolError(f"{where}[{i}]: expected {item.words}, got nil")
                continue
            try:  # the path is built only for an error: every frame passes here
                checked = item.check(x, "")
            except ProtocolError as exc:
                raise exc.under(f"{where}[{i}]") from None
            if checked is not x:
                v[i] = checked
        return v

    def fit(self, v: Any) -> Any:
        if type(v) is not list and type(v) is not tuple:
            return None
        item: Any = self.item
        if item.code == STR and item.choices is None and len(v) <= self.max_items and all(
                type(x) is str and len(x) <= item.max_len and x.isprintable() for x in v):
            return list(v)  # printable names that fit, the usual case, in one pass
        out: list[Any] = []
        for x in v:
            if len(out) == self.max_items:
                break
            fitted = None if x is None else self.item.fit(x)
            if fitted is not None or (self.nil and x is None):
                out.append(fitted)
        return out


class MapOf(WireType):
    """A map of string keys (at most `key_len` characters) to values of one type, at most
    `max_items` of them; values may be nil where `nil`."""

    __slots__ = ("key_len", "max_items", "nil", "value")

    def __init__(self, value: WireType, max_items: int = 64, *, key_len: int = MAX_KEY,
                 nil: bool = True, doc: str | None = None) -> None:
        self.value, self.max_items, self.key_len, self.nil = value, max_items, key_len, nil
        super().__init__(doc or f"{{str: {value.doc}}} <= {max_items}",
                         f"a map of at most {max_items} names (at most {key_len} characters) "
                         f"to {value.words}" + (" or nil" if nil else ""))

    def check(self, v: Any, where: str) -> Any:
        if type(v) is not dict or len(v) > self.max_items:
            raise self.bad(v, where)
        value = self.value
        bad_keys = False
        for k, x in v.items():
            if type(k) is not str or len(k) > self.key_len:
                raise ProtocolError(f"{where}: expected names of at most {self.key_len} "
                                    f"characters as keys, got {show(k)}")
            if not k.isprintable():
                bad_keys = True
            if x is None:
                if not self.nil:
                    raise ProtocolError(f"{where}.{k}: expected {value.words}, got nil")
                continue
            _checked_in_place(v, k, x, value, where)
        if bad_keys:
            for k in [k for k in v if not k.isprintable()]:
                v[clean(k)] = v.pop(k)
        return v

    def fit(self, v: Any) -> Any:
        if type(v) is not dict:
            return None
        value: Any = self.value
        if len(v) <= self.max_items and value.code == NUM and value.above is None:
            # The agent's usual map (a port's hw counters): printable names of numbers
            # within bounds, kept as they are after one pass.
            lo, hi, key_len = value.lo, value.hi, self.key_len
            if all(type(k) is str and len(k) <= key_len and k.isprintable() and (
                    (x is None and self.nil)
                    or ((type(x) is float or type(x) is int) and lo <= x <= hi))
                   for k, x in v.items()):
                return dict(v)
        out: dict[str, Any] = {}
        for k, x in v.items():
            if len(out) == self.max_items:
                break
            key = _KEY.fit(k) if type(k) is str else None
            if key is None:
                continue
            key = key[:self.key_len]
            fitted = None if x is None else value.fit(x)
            if fitted is not None or self.nil:
                out[key] = fitted
        return out


_KEY = Str()


class Record(WireType):
    """A map with known keys (`fields`: objects with `key`, `type`, `required`), each
    checked by its type; required ones present and not nil. Keys it does not know (a
    newer sender's) are kept, cleaned, at most MAX_UNKNOWN_DEPTH deep."""

    __slots__ = ("_check", "_fit", "_required", "_spec", "fields", "name")

    def __init__(self, name: str, fields: Iterable[FieldLike], *, doc: str | None = None) -> None:
        self.name = name
        self.fields = tuple(fields)
        # Any: the agent's fit reads each type's own bounds (lo, hi, max_len, ...) inline.
        self._spec: dict[str, Any] = {f.key: f.type for f in self.fields}
        self._required = tuple(f.key for f in self.fields if f.required)
        super().__init__(doc or name, f"a map ({name})")
        # Each compiled when first used: a process checks or fits a few of the ~30
        # records, and compiling all at import took a twentieth of a second of every
        # `tuimon` command's start.
        self._check: Callable[[Any, str], Any] = self._check_first
        self._fit: Callable[[dict[Any, Any]], Any] = self._fit_first

    def check(self, v: Any, where: str) -> Any:
        return self._check(v, where)

    def _check_first(self, v: Any, where: str) -> Any:
        self._check = self._compile()
        return self._check(v, where)

    def _fit_first(self, v: dict[Any, Any]) -> Any:
        self._fit = self._compile_fit()
        return self._fit(v)

    def _compile(self) -> Callable[[Any, str], Any]:
        """The record's check as one function with a line per field: a viewer checks
        every node's frames every second, and a loop that looks up each key's type and
        its bounds costs about twice as much as these unrolled tests (the overview
        frame's findings, a full frame's GPUs). What it tests is each field's type:
        the same code as the types' own check, written out."""
        ns: dict[str, Any] = {"ProtocolError": ProtocolError, "clean": clean, "show": show,
                              "_unknown": self._unknown, "_bad": self.bad,
                              "KEYS": frozenset(self._spec), "SPEC": self._spec,
                              "_checked_in_place": _checked_in_place,
                              "REQUIRED": frozenset(self._required)}
        out = ["def check(v, where):",
               "    if type(v) is not dict:",
               "        raise _bad(v, where)",
               # A map of a few of many keys (a Prometheus GPU: three of 47) is checked
               # key by key; the written-out tests below cost a look-up per field.
               f"    if len(v) <= {len(self.fields) // SPARSE_SHARE}"
               + (" and REQUIRED <= v.keys()" if self._required else "") + ":",
               "        for k, x in v.items():",
               "            t = SPEC.get(k)",
               "            if t is None:",
               "                break",  # not the record's key: the written-out check
               "            if x is None:",
               "                if k in REQUIRED:",
               "                    raise ProtocolError(f'{where}.{k}: required {t.words}, "
               "got nil')",
               "                continue",
               "            code = t.code",
               f"            if code == {NUM}:",
               "                if not ((type(x) is float or type(x) is int) and t.lo <= x <= t.hi"
               " and (t.above is None or x > t.above)):",
               "                    raise t.bad(x, f'{where}.{k}')",
               f"            elif code == {INT}:",
               "                if type(x) is not int or x < t.lo or (t.hi is not None"
               " and x > t.hi):",
               "                    raise t.bad(x, f'{where}.{k}')",
               f"            elif code == {STR}:",
               "                if type(x) is not str or len(x) > t.max_len or ("
               "t.choices is not None and x not in t.choices):",
               "                    raise t.bad(x, f'{where}.{k}')",
               "                if not x.isprintable():",
               "                    v[k] = clean(x)",  # a value replaced: the size stays
               "            else:",
               "                _checked_in_place(v, k, x, t, where)",
               "        else:",
               "            return v",
               "    get = v.get"]
        for i, f in enumerate(self.fields):
            t: Any = f.type  # a Num's, Int's or Str's bounds are written into the code
            key, name = repr(f.key), f"T{i}"
            ns[name] = t
            path = repr("." + f.key)
            out.append(f"    x = get({key})")
            if f.required:
                out.append("    if x is None:")
                out.append(f"        raise ProtocolError(where + {path} + ': required ' + "
                           f"{name}.words + ', got nil')")
                pad = "    "
            else:
                out.append("    if x is not None:")
                pad = "        "
            bad = f"raise {name}.bad(x, where + {path})"
            if t.code == NUM:
                test = f"{t.lo!r} <= x <= {t.hi!r}" + (
                    f" and x > {t.above!r}" if t.above is not None else "")
                out.append(f"{pad}if not ((type(x) is float or type(x) is int) and {test}):")
                out.append(f"{pad}    {bad}")
            elif t.code == INT:
                test = f"{t.lo!r} <= x" + (f" <= {t.hi!r}" if t.hi is not None else "")
                out.append(f"{pad}if type(x) is not int or not {test}:")
                out.append(f"{pad}    {bad}")
            elif t.code == STR:
                test = f"len(x) > {t.max_len!r}" + (
                    f" or x not in {name}.choices" if t.choices is not None else "")
                out.append(f"{pad}if type(x) is not str or {test}:")
                out.append(f"{pad}    {bad}")
                out.append(f"{pad}if not x.isprintable():")
                out.append(f"{pad}    v[{key}] = clean(x)")
            else:  # the path is built only for an error
                out.append(f"{pad}try:")
                out.append(f"{pad}    c = {name}.check(x, '')")
                out.append(f"{pad}except ProtocolError as exc:")
                out.append(f"{pad}    raise exc.under(where + {path}) from None")
                out.append(f"{pad}if c is not x:")
                out.append(f"{pad}    v[{key}] = c")
        out.append("    if not v.keys() <= KEYS:")
        out.append("        _unknown(v, where)")
        out.append("    return v")
        exec(compile("\n".join(out), f"<check of {self.name}>", "exec"), ns)
        return ns["check"]

    def _unknown(self, v: dict[Any, Any], where: str) -> None:
        """Keys the record does not know (a newer sender's): kept, cleaned, bounded."""
        for key in [k for k in v if k not in self._spec]:
            value = v.pop(key)
            if type(key) is not str or len(key) > MAX_KEY:
                raise ProtocolError(f"{where}: expected names of at most {MAX_KEY} characters "
                                    f"as keys, got {show(key)}")
            v[clean(key)] = unknown_value(value, f"{where}.{key}", 1)

    def fit(self, v: Any) -> Any:
        """The known keys fitted, in the record's order; a record whose required key
        cannot be is None. Keys the record does not declare are left out: a sender sends
        what it declared."""
        if type(v) is not dict:
            return None
        return self._fit(v)

    def _compile_fit(self) -> Callable[[dict[Any, Any]], Any]:
        """The record's fit as one function with a line per field, like its check: every
        sample the agent sends passes here, and a plain value (a number within its
        bounds, a printable string that fits) is kept by an inline test; anything else
        goes to its type's own fit."""
        ns: dict[str, Any] = {"MISSING": _MISSING}
        out = ["def fit(v):", "    get = v.get", "    out = {}"]
        for i, f in enumerate(self.fields):
            t: Any = f.type
            key, name = repr(f.key), f"T{i}"
            ns[name] = t
            if t.code == NUM and t.above is None:
                plain = f"(type(x) is float or type(x) is int) and {t.lo!r} <= x <= {t.hi!r}"
            elif t.code == INT:
                plain = f"type(x) is int and {t.lo!r} <= x" + (
                    f" <= {t.hi!r}" if t.hi is not None else "")
            elif t.code == STR and t.choices is None:
                plain = f"type(x) is str and len(x) <= {t.max_len!r} and x.isprintable()"
            else:
                plain = "False"
            out.append(f"    x = get({key}, MISSING)")
            out.append("    if x is not MISSING:")
            out.append(f"        if x is not None and not ({plain}):")
            out.append(f"            x = {name}.fit(x)")
            out.append(f"        out[{key}] = x")
            if f.required:
                out.append("    if out.get(" + key + ") is None:")
                out.append("        return None")
        out.append("    return out")
        exec(compile("\n".join(out), f"<fit of {self.name}>", "exec"), ns)
        return ns["fit"]


_MISSING = object()


def unknown_value(v: Any, where: str, depth: int) -> Any:
    """A value no record describes (a newer sender's): scalars as they are (strings
    cleaned), maps and lists at most MAX_UNKNOWN_DEPTH deep."""
    t = type(v)
    if t is str:
        return v if v.isprintable() else clean(v)
    if t is dict or t is list:
        if depth >= MAX_UNKNOWN_DEPTH:
            raise ProtocolError(f"{where}: nested deeper than {MAX_UNKNOWN_DEPTH}")
        if t is list:
            return [unknown_value(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
        out = {}
        for k, x in v.items():
            if type(k) is not str:
                raise ProtocolError(f"{where}: expected strings as keys, got {show(k)}")
            out[clean(k)] = unknown_value(x, f"{where}.{k}", depth + 1)
        return out
    if t is float and v - v != 0:
        raise ProtocolError(f"{where}: expected a finite number, got {show(v)}")
    return v


class AnyOf(WireType):
    """A value of the first of several types it fits (a port named by number or text)."""

    __slots__ = ("types",)

    def __init__(self, *types: WireType, doc: str | None = None) -> None:
        self.types = types
        super().__init__(doc or " or ".join(t.doc for t in types),
                         " or ".join(t.words for t in types))

    def check(self, v: Any, where: str) -> Any:
        for t in self.types:
            try:
                return t.check(v, where)
            except ProtocolError:
                continue
        raise self.bad(v, where)
