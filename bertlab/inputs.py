"""A student's typed input, checked: the error a panel shows (`InputError`), empty / broken / invisible
text refused, long input quoted short. Below training, analysis and viz, which all check text."""

from __future__ import annotations

import errno
import re
import unicodedata

ECHO_CHARS = 60  # a student's input quoted in a message is cut to this many characters
PATH_MAX_BYTES, NAME_MAX_BYTES = 4096, 255  # Linux's limits on a whole path and on one file or folder name
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


def check_path_text(text: str, what: str = "path") -> str:
    """`text` when it is not too long to be a path; else an InputError saying why (too long as a whole
    or in one name) and what to type instead, quoting at most ECHO_CHARS of it."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > PATH_MAX_BYTES:
        raise InputError(
            f"That {what} is {len(text):,} characters long, and a path has at most {PATH_MAX_BYTES:,}: it is not "
            f"a path. Type or paste only the path, e.g. runs/my-model or sst2/train.tsv."
        )
    longest = max(text.replace("\\", "/").split("/"), key=lambda part: len(part.encode("utf-8", "surrogatepass")))
    if len(longest.encode("utf-8", "surrogatepass")) > NAME_MAX_BYTES:
        raise InputError(
            f"One name in that {what} ({echo(longest)}) is longer than the {NAME_MAX_BYTES} characters a file or "
            f"folder name can have: check what you pasted, or pick a shorter name."
        )
    return text


_OS_ERRORS = {
    errno.ENAMETOOLONG: "the path or one of its names is too long: pick a shorter one",
    errno.EEXIST: "a file or folder of that name is in the way: pick another name, or remove it first",
    errno.ENOENT: "there is no such file or folder: check the spelling and where it lies",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EISDIR: "that is a folder, but a file is needed here: add the file's name",
    errno.EACCES: "this program may not open that place: pick a folder of your own",
    errno.EPERM: "this program may not change that place: pick a folder of your own",
    errno.EROFS: "that place is read-only: pick a folder you can write to",
    errno.ENOSPC: "the disk is full: free some space (delete old runs) and try again",
    errno.EDQUOT: "your disk quota is used up: delete old runs and try again",
}


def os_error_message(error: OSError, action: str, path: object | None = None) -> str:
    """A sentence for an OSError, without its errno or a whole path: "Could not <action> <'path'>: <why>."."""
    where = f" {echo(path if path is not None else error.filename)}" if (path or error.filename) else ""
    why = _OS_ERRORS.get(error.errno or -1) or (error.strerror or "the system refused").lower()
    return f"Could not {action}{where}: {why}."


__all__ = ["ECHO_CHARS", "InputError", "check_path_text", "echo", "optional_text", "os_error_message",
           "require_text"]
