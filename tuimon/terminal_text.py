"""Text from the network made safe for a terminal: no escape sequences, no bells.

A node name, device name, reason or event message comes from an agent, a relay or
Prometheus; printed raw, `evil\\x1b]0;...\\x07` would retitle the terminal or worse.
Every control character (and any other unprintable one) is shown as its escape.
"""

from __future__ import annotations

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), 0x7F)}
_CONTROL_BUT_NEWLINE = {c: v for c, v in _CONTROL.items() if c != 0x0A}


def printable(text: str, *, keep_newlines: bool = False) -> str:
    cleaned = text.translate(_CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL)
    if cleaned.isprintable() or (keep_newlines and cleaned.replace("\n", "").isprintable()):
        return cleaned
    return "".join(ch if ch.isprintable() or (keep_newlines and ch == "\n")
                   else f"\\u{ord(ch):04x}" for ch in cleaned)
