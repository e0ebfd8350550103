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

from collections.abc import Iterable
from typing import Any, Protocol

from tuimon_core.protocol.errors import ProtocolError
from tuimon_core.protocol.text import clean

MAX_STR = 4096
# The largest magnitude of a number on the wire: far above any real value (bytes/s,
# joules, hertz), far below where sums over a cluster or a multiplication by a scale
# overflow a float; so a reader's arithmetic on any valid value stays finite.
MAX_NUM = 1e18
# Nesting of a value no record describes (a newer agent's field): deeper is refused.
MAX_UNKNOWN_DEPTH = 4


def show(v: Any) -> str:
    """A value as an error names it: its type and the start of its text."""
    if v is None:
        return "nil"
    return f"{type(v).__name__} {repr(v)[:40]}"


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
        # How a record checks a value of this type inline (hot path): 1 any finite
        # number, 2 any non-negative integer, 3 any string of at most MAX_STR; 0: check().
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
        unbounded = lo is None and hi is None and above is None
        if doc is None:
            low = f"> {above:g}" if above is not None else (
                f">= {lo:g}" if lo is not None else "")
            doc = "num" + (f" {low}" if low else "") + (
                f" <= {hi:g}" if hi is not None else "")
        lo = -MAX_NUM if lo is None and above is None else lo
        hi = MAX_NUM if hi is None else hi
        self.lo, self.hi, self.above = lo, hi, above
        low = f"> {above:g}" if above is not None else f">= {lo:g}"
        super().__init__(doc, f"a number {low} and <= {hi:g}")
        self.code = 1 if unbounded else 0

    def check(self, v: Any, where: str) -> Any:
        t = type(v)
        if t is not float and t is not int:  # NaN fails every comparison below
            raise self.bad(v, where)
        if not ((self.lo is None or v >= self.lo) and v <= self.hi and
                (self.above is None or v > self.above)):
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
        super().__init__(doc, words + (f" <= {hi}" if hi is not None else ""))
        self.code = 2 if lo == 0 and hi is None else 0

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
        super().__init__(doc, words)
        self.code = 3 if max_len == MAX_STR and choices is None else 0

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
        item = self.item
        code = item.code
        if code == 3:  # strings: the usual case checked in C-level passes
            if all(type(x) is str and len(x) <= MAX_STR for x in v):
                return v if all(map(str.isprintable, v)) else [clean(x) for x in v]
        elif code == 1 and all(type(x) is float or type(x) is int for x in v) and (
                not v or (sum(v) - sum(v) == 0 and min(v) >= -MAX_NUM and max(v) <= MAX_NUM)):
            return v  # the sum is NaN where any item is: min and max skip NaN
        for i, x in enumerate(v):
            if x is None:
                if not self.nil:
                    raise ProtocolError(f"{where}[{i}]: expected {item.words}, got nil")
                continue
            checked = item.check(x, f"{where}[{i}]")
            if checked is not x:
                v[i] = checked
        return v

    def fit(self, v: Any) -> Any:
        if type(v) is not list and type(v) is not tuple:
            return None
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

    def __init__(self, value: WireType, max_items: int = 64, *, key_len: int = 128,
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
            checked = value.check(x, f"{where}.{k}")
            if checked is not x:
                v[k] = checked
        if bad_keys:
            for k in [k for k in v if not k.isprintable()]:
                v[clean(k)] = v.pop(k)
        return v

    def fit(self, v: Any) -> Any:
        if type(v) is not dict:
            return None
        out: dict[str, Any] = {}
        for k, x in v.items():
            if len(out) == self.max_items:
                break
            key = _KEY.fit(k) if type(k) is str else None
            if key is None:
                continue
            key = key[:self.key_len]
            fitted = None if x is None else self.value.fit(x)
            if fitted is not None or self.nil:
                out[key] = fitted
        return out


_KEY = Str()


class Record(WireType):
    """A map with known keys (`fields`: objects with `key`, `type`, `required`), each
    checked by its type; required ones present and not nil. Keys it does not know (a
    newer sender's) are kept, cleaned, at most MAX_UNKNOWN_DEPTH deep."""

    __slots__ = ("_required", "_spec", "fields", "name")

    def __init__(self, name: str, fields: Iterable[FieldLike], *, doc: str | None = None) -> None:
        self.name = name
        self.fields = tuple(fields)
        self._spec = {f.key: f.type for f in self.fields}
        self._required = tuple(f.key for f in self.fields if f.required)
        super().__init__(doc or name, f"a map ({name})")

    def check(self, v: Any, where: str) -> Any:
        if type(v) is not dict:
            raise self.bad(v, where)
        spec = self._spec
        unknown = False
        # Hot path (every GPU of every node a viewer takes whole): plain numbers and
        # strings are checked inline, by exact type; the rest by their type's check.
        for key, x in v.items():
            t = spec.get(key)
            if t is None:
                unknown = True
                continue
            if x is None:
                continue
            code = t.code
            tx = type(x)
            if code == 1:
                if (tx is float or tx is int) and -MAX_NUM <= x <= MAX_NUM:
                    continue
            elif code == 2:
                if tx is int and x >= 0:
                    continue
            elif code == 3:
                if tx is str and len(x) <= MAX_STR:
                    if not x.isprintable():
                        v[key] = clean(x)
                    continue
            else:
                checked = t.check(x, f"{where}.{key}")
                if checked is not x:
                    v[key] = checked
                continue
            raise t.bad(x, f"{where}.{key}")
        for key in self._required:
            if v.get(key) is None:
                raise ProtocolError(f"{where}.{key}: required {spec[key].words}, got "
                                    f"{show(v.get(key))}")
        if unknown:
            for key in [k for k in v if k not in spec]:
                value = v.pop(key)
                if type(key) is not str or len(key) > 128:
                    raise ProtocolError(f"{where}: expected names of at most 128 characters "
                                        f"as keys, got {show(key)}")
                v[clean(key)] = unknown_value(value, f"{where}.{key}", 1)
        return v

    def fit(self, v: Any) -> Any:
        """The known keys fitted; a record whose required key cannot be is None. Keys the
        record does not declare are left out: a sender sends what it declared."""
        if type(v) is not dict:
            return None
        spec = self._spec
        out = {}
        # Every sample the agent sends passes here: plain values are kept inline.
        for key, x in v.items():
            t = spec.get(key)
            if t is None:
                continue
            if x is not None:
                code = t.code
                tx = type(x)
                if not ((code == 1 and (tx is float or tx is int) and -MAX_NUM <= x <= MAX_NUM)
                        or (code == 2 and tx is int and x >= 0)
                        or (code == 3 and tx is str and len(x) <= MAX_STR
                            and x.isprintable())):
                    x = t.fit(x)
            out[key] = x
        for key in self._required:
            if out.get(key) is None:
                return None
        return out


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
