"""Text rules, all in one module: ids that come from tokens, text that people
show to their family, and MIME types.

Display text (names, titles, comments, tags) must not fool the person who reads
it nor break what it is stored in, so it refuses:
- C0 and C1 control characters (a newline is allowed in comment bodies);
- every bidirectional control: embeddings, overrides and isolates (U+202A-U+202E,
  U+2066-U+2069), which reorder what a reader sees, and the marks (U+200E, U+200F,
  U+061C), which are invisible and can move a neutral character across a name
  (right-to-left names render by their letters' own direction without them);
- line and paragraph separators (U+2028, U+2029), which break a line where
  the text shows none, and the interlinear annotation characters
  (U+FFF9-U+FFFB), which hide text;
- zero-width and invisible characters, tag characters (U+E0000-U+E007F)
  included, except a zero-width joiner, variation selector or tag inside an
  emoji sequence (a family emoji, a flag, a skin tone).
An email address refuses the same characters: an invite mails it, and a
reader sees it in the family's list of invites.
"""

from __future__ import annotations

import re
import unicodedata

import emoji as emoji_data

from resolvers.core.errors import BadInput
from store import keys

MAX_SUBJECT = 128

BIDI_CONTROLS = (
    frozenset(range(0x202A, 0x202F)) | frozenset(range(0x2066, 0x206A)) | frozenset({0x200E, 0x200F, 0x061C})
)
# Refused anywhere: line and paragraph separators, interlinear annotations.
HIDDEN_BREAKS = frozenset({0x2028, 0x2029, 0xFFF9, 0xFFFA, 0xFFFB})
# Invisible characters that render as nothing: zero-width space, non-joiner and
# joiner, word joiner and invisible operators, the deprecated format controls,
# the byte-order mark, the Mongolian vowel separator, variation selectors and
# the Hangul fillers.
INVISIBLE = (
    frozenset({0x00AD, 0x034F, 0x180E, 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF})
    | frozenset({0x115F, 0x1160, 0x3164, 0xFFA0})
    | frozenset(range(0x2061, 0x2065))
    | frozenset(range(0x206A, 0x2070))
    | frozenset(range(0xFE00, 0xFE10))
    | frozenset(range(0xE0100, 0xE01F0))
    # Tag characters: they spell a subdivision flag inside an emoji, nothing outside.
    | frozenset(range(0xE0000, 0xE0080))
)

# RFC 6838, section 4.2: type-name "/" subtype-name, each a restricted-name.
_RESTRICTED_NAME = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_MIME_TYPE = re.compile(rf"{_RESTRICTED_NAME}/{_RESTRICTED_NAME}")


def subject_problem(sub: object) -> str | None:
    """Why a token's `sub` cannot be a user id here, or None when it can.
    Ids become parts of table keys and appear in logs: printable, at most 128
    characters, not blank, no control characters and no '#' (the key separator)."""
    if not isinstance(sub, str) or not sub.strip():
        return "the token has no subject"
    if len(sub) > MAX_SUBJECT:
        return f"the token's subject is longer than {MAX_SUBJECT} characters"
    if not sub.isprintable() or not keys.usable_id(sub):
        return "the token's subject holds characters an id cannot have"
    return None


def _emoji_spans(text: str) -> list[tuple[int, int]]:
    return [(found["match_start"], found["match_end"]) for found in emoji_data.emoji_list(text)]


def display_problem(text: str, *, multiline: bool = False) -> str | None:
    """What in the text could fool a reader, or None when nothing does."""
    spans: list[tuple[int, int]] | None = None
    for index, ch in enumerate(text):
        cp = ord(ch)
        if unicodedata.category(ch) == "Cc":
            if multiline and ch == "\n":
                continue
            return "must not contain control characters"
        if unicodedata.category(ch) == "Cs":
            return "must not contain lone surrogates"
        if cp in BIDI_CONTROLS:
            return "must not contain bidirectional control characters (marks, overrides or isolates)"
        if cp in HIDDEN_BREAKS:
            return "must not contain line separators or interlinear annotation characters"
        if cp in INVISIBLE:
            if spans is None:
                spans = _emoji_spans(text)
            if not any(start < index < end for start, end in spans):
                return "must not contain zero-width or invisible characters outside an emoji"
    return None


def check_display(text: str, field: str, *, multiline: bool = False) -> None:
    problem = display_problem(text, multiline=multiline)
    if problem is not None:
        raise BadInput(f"{field} {problem}")


def clean_text(
    value: str, field: str, max_length: int, *, min_length: int = 1, multiline: bool = False
) -> str:
    """Trimmed, NFC-normalized display text of a bounded length."""
    text = unicodedata.normalize("NFC", value.strip())
    if multiline:
        text = text.replace("\r\n", "\n")
    if len(text) < min_length:
        raise BadInput(f"{field} must not be empty")
    if len(text) > max_length:
        raise BadInput(f"{field} must be at most {max_length} characters")
    check_display(text, field, multiline=multiline)
    return text


def clean_optional(value: str | None, field: str, max_length: int) -> str | None:
    return None if value is None else clean_text(value, field, max_length)


def clean_url(value: str, field: str) -> str:
    url = clean_text(value, field, 2048)
    if not url.startswith(("https://", "http://")):
        raise BadInput(f"{field} must be an http(s) URL")
    return url


MAX_EMAIL = 254


def clean_email(value: str, field: str) -> str:
    """One address, as a person types it: something@domain, nothing around it."""
    address = value.strip()
    local, _, domain = address.rpartition("@")
    if (
        not local
        or "." not in domain
        or len(address) > MAX_EMAIL
        or any(ch.isspace() or ch in '<>,;"()[]\\' or ord(ch) < 32 for ch in address)
        or domain.startswith(".")
        or domain.endswith(".")
    ):
        raise BadInput(f"{field} must be an email address, like ana@example.org")
    check_display(address, field)
    return address


def claim_text(value: object, max_length: int = 256) -> str | None:
    """A display claim from a token (a name, an email), or None when it is
    absent or would fool a reader: the profile then starts without it."""
    if not isinstance(value, str):
        return None
    text = unicodedata.normalize("NFC", value.strip())[:max_length]
    if not text or display_problem(text) is not None:
        return None
    return text


def clean_mime_type(value: str) -> str:
    """A MIME type in RFC 6838's `type/subtype` grammar, lower-cased; no parameters."""
    mime = value.strip().lower()
    if not _MIME_TYPE.fullmatch(mime):
        raise BadInput(f"mimeType must be a MIME type such as image/jpeg, not {value[:100]!r}")
    return mime
