"""The one sanitising path for strings from outside: node, job, device and mount names,
reasons and messages from the network, the step socket, NVML, /proc and /sys.

A string is made printable where it enters (the decoder, the agent's collectors and
step receiver, the target parsers), so no terminal, log line, Prometheus label or file
downstream ever sees a raw control character. Printed raw, `evil\\x1b]0;title\\x07`
retitles a terminal, OSC 52 writes the clipboard, `\\x1b[2J` wipes the screen and a
newline forges a line of output. Every character Python does not call printable
(C0/C1 controls, DEL, bidi overrides such as U+202E, line and paragraph separators,
non-ASCII spaces) is replaced by its escape, so the name stays recognisable.
"""

from __future__ import annotations

from typing import Any


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def clean(text: str) -> str:
    """`text` with every unprintable character escaped; unchanged (and cheap) when it has
    none. Idempotent: an escape is printable."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def clean_lines(text: str) -> str:
    """A block of output lines made safe line by line: newlines the caller put there
    stay, anything else unprintable is escaped."""
    return "\n".join(clean(line) for line in text.split("\n"))


def clean_tree(value: Any) -> Any:
    """Every string (and map key) in a nested structure of maps, lists and scalars made
    printable, in place; returns the value (a string is returned cleaned). Exact type
    checks: this runs over every sample the agent takes."""
    t = type(value)
    if t is str:
        return value if value.isprintable() else clean(value)
    if t is dict:
        _clean_items(value, value.items())
        bad = [k for k in value if type(k) is str and not k.isprintable()]
        for k in bad:
            value[clean(k)] = value.pop(k)
    elif t is list:
        _clean_items(value, enumerate(value))
    return value


def _clean_items(container: Any, items: Any) -> None:
    for k, v in items:
        tv = type(v)
        if tv is str:
            if not v.isprintable():
                container[k] = clean(v)
        elif tv is dict or tv is list:
            clean_tree(v)
