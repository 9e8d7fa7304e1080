"""Pure computations behind the panels: model + tokenizer + text in, dataclasses out."""


class InputError(ValueError):
    """Text a panel cannot use (empty, no [MASK], empty second sentence, ...); the message is for the student."""


def require_text(text: str | None, what: str = "text") -> str:
    """The stripped text, or an InputError saying what is missing."""
    if text is None or not str(text).strip():
        raise InputError(f"The {what} is empty: type a sentence first.")
    return str(text)
