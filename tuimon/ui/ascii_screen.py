"""The screen in ASCII, for terminals that cannot show more (a C or POSIX locale, a
serial console): every glyph the app and Textual draw, mapped to an ASCII one of the
same width, as the last step before the terminal (a Textual line filter). One place
for every glyph, ours and Textual's, so nothing arrives as `_` or `?`.

The heat scale keeps its order in ASCII (" .:-=+*#%@" from empty to full), so a map
reads without colour or Unicode; a failed cell is `x`, old data `~`, no data `.`.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.cells import cell_len
from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter

# Block elements by height: the heat levels, sparklines and bars.
_LEVELS = dict(zip("\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588", ".:-=+*#@"))
_GLYPHS = {
    **_LEVELS,
    "\u2591": "~", "\u2592": "~", "\u2593": "#",  # shades: old data
    "\u2717": "x", "\u2716": "x", "\u2715": "x",  # failed
    "\u00b7": ".", "\u2022": "*", "\u25cf": "*", "\u25cb": "o",
    "\u2500": "-", "\u2501": "-", "\u2504": "-", "\u2550": "=", "\u2574": "-", "\u2576": "-",
    "\u2502": "|", "\u2503": "|", "\u2506": "|", "\u2551": "|", "\u2575": "|", "\u2577": "|",
    "\u258f": "|", "\u2595": "|", "\u258e": "|", "\u258d": "|", "\u258c": "|",
    "\u250c": "+", "\u2510": "+", "\u2514": "+", "\u2518": "+", "\u251c": "+",
    "\u2524": "+", "\u252c": "+", "\u2534": "+", "\u253c": "+", "\u256d": "+",
    "\u256e": "+", "\u256f": "+", "\u2570": "+", "\u2554": "+", "\u2557": "+",
    "\u255a": "+", "\u255d": "+",
    "\u2191": "^", "\u2193": "v", "\u2190": "<", "\u2192": ">", "\u25b2": "^",
    "\u25bc": "v", "\u25b6": ">", "\u25c0": "<",
    "\u23ce": "<", "\u2026": ".", "\u00b0": " ", "\u00d7": "x", "\u2013": "-",
    "\u2014": "-", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
    "\u00a0": " ", "\u200b": "",
}
_TABLE = str.maketrans(_GLYPHS)


def locale_is_ascii(env: Mapping[str, str]) -> bool:
    """Whether the terminal's locale (LC_ALL, else LC_CTYPE, else LANG) cannot show
    UTF-8. Python turns a C locale's LC_CTYPE into C.UTF-8 for itself (PEP 538): with
    LANG still C or POSIX, that is the C locale, not a UTF-8 terminal."""
    def utf8(value: str) -> bool:
        return "UTF-8" in value.upper().replace("UTF8", "UTF-8")
    lc_all = env.get("LC_ALL", "")
    if lc_all:
        return not utf8(lc_all)
    lang = env.get("LANG", "")
    lc_ctype = env.get("LC_CTYPE", "")
    coerced = lc_ctype in ("C.UTF-8", "C.utf8", "UTF-8") and lang.upper() in ("C", "POSIX")
    if lc_ctype and not coerced:
        return not utf8(lc_ctype)
    if lang:
        return not utf8(lang)
    return False  # nothing said: today's terminals are UTF-8


def to_ascii(text: str) -> str:
    """The text in ASCII, cell for cell: known glyphs by their ASCII look-alike, anything
    else as `?` per cell it takes (a wide character, two)."""
    text = text.translate(_TABLE)
    if text.isascii():
        return text
    return "".join(c if c.isascii() else "?" * cell_len(c) for c in text)


class AsciiScreen(LineFilter):
    """Every segment's text in ASCII, styles unchanged."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        return [seg if seg.text.isascii() else Segment(to_ascii(seg.text), seg.style,
                                                        seg.control)
                for seg in segments]
