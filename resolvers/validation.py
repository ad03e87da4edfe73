"""Input rules shared by the mutations."""

from __future__ import annotations

import unicodedata

from resolvers.errors import BadInput


def clean_text(value: str, field: str, max_length: int, *, min_length: int = 1) -> str:
    """Trimmed, normalized text of a bounded length; control characters refused."""
    text = unicodedata.normalize("NFC", value.strip())
    if len(text) < min_length:
        raise BadInput(f"{field} must not be empty")
    if len(text) > max_length:
        raise BadInput(f"{field} must be at most {max_length} characters")
    if any(unicodedata.category(ch) == "Cc" and ch not in "\n\t" for ch in text):
        raise BadInput(f"{field} must not contain control characters")
    return text


def clean_optional(value: str | None, field: str, max_length: int) -> str | None:
    return None if value is None else clean_text(value, field, max_length)


def clean_url(value: str, field: str) -> str:
    url = clean_text(value, field, 2048)
    if not url.startswith(("https://", "http://")):
        raise BadInput(f"{field} must be an http(s) URL")
    return url
