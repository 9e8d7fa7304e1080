"""A student's typed input, checked: the error a panel shows (`InputError`), empty / broken / invisible
text refused, long input quoted short. Below training, analysis and viz, which all check text."""

from __future__ import annotations

import re
import unicodedata

ECHO_CHARS = 60  # a student's input quoted in a message is cut to this many characters
_INVISIBLE = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})  # control, format (zero-width), separators


class InputError(ValueError):
    """Text a panel cannot use (empty, no [MASK], empty second sentence, ...); the message is for the student."""


def require_text(text: str | None, what: str = "text") -> str:
    """`text` unchanged, or an InputError the student can act on when it is empty or blank, holds
    a broken character (a lone UTF-16 surrogate, which the tokenizer cannot read), or holds only
    invisible characters (control or zero-width ones, which the tokenizer drops)."""
    if text is None or not str(text).strip():
        raise InputError(f"The {what} is empty: type a sentence first.")
    text = str(text)
    broken = next((c for c in text if "\ud800" <= c <= "\udfff"), None)
    if broken is not None:
        raise InputError(
            f"The {what} holds a broken character (U+{ord(broken):04X}, half of an emoji or another rare "
            "symbol, often left by copying part of one): delete it or type the text again."
        )
    if all(unicodedata.category(c) in _INVISIBLE for c in text):
        raise InputError(
            f"The {what} has only invisible characters (control or zero-width ones, e.g. U+200B), which the "
            "model does not read: type some words."
        )
    return text


def optional_text(text: str | None, what: str = "second sentence") -> str | None:
    """None for a missing or blank optional text (e.g. sentence B); otherwise checked as `require_text`."""
    if text is None or not str(text).strip():
        return None
    return require_text(text, what)


def echo(text: object, limit: int = ECHO_CHARS) -> str:
    """A student's input quoted for a message, cut to `limit` characters ("'a very long…' (5,000
    characters)") and with broken characters replaced, so a message never repeats a whole essay."""
    s = re.sub("[\ud800-\udfff]", "\ufffd", " ".join(str(text).split()))
    if len(s) <= limit:
        return f"'{s}'"
    return f"'{s[: limit - 1]}…' ({len(s):,} characters)"
