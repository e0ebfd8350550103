"""Text from the network in Textual markup: shown as the text it is, never as markup."""

from __future__ import annotations

from tuimon_core.protocol.text import clean


def safe(text: str, width: int | None = None) -> str:
    """Text for Textual markup: cleaned (tuimon_core.protocol.text, the one sanitising path;
    strings from outside were already cleaned where they entered, this is the last guard)
    and every markup bracket escaped.

    Every `[` is escaped, not only those that look like tags (textual.markup.escape's
    rule): Textual's parser opens a tag at any `[`, so `\x1b[2J` in a name would swallow
    the markup after it. A trailing backslash would escape the caller's next `[`, so it
    gets a zero-width space after it.
    """
    cleaned = clean(text)
    if width is not None:
        cleaned = cleaned[:width]
    cleaned = cleaned.replace("[", "\\[")
    return cleaned + "\u200b" if cleaned.endswith("\\") else cleaned
