"""Removing known secret values (the upstream API keys agl holds, a rollout's own token) from what agl writes about
a rollout: its recorded calls, stored output, stdout and stderr tails, errors, grader detail, and its output file.

Unlike the report's pattern-based scrub, this knows the exact values, so a key of any format is caught. Only whole
values are replaced, never a piece of a word: a value shorter than MIN_SECRET_CHARS is not redacted at all (with
OPENAI_API_KEY=dev, "a device" must stay "a device"; `short_secrets` names such values so agl can say so), and a
value shorter than ANYWHERE_SECRET_CHARS is replaced only where it stands alone, not inside a longer word. A longer
value is replaced wherever it appears: no ordinary text holds 20 characters of a key by chance, and a key glued to
other characters (`key%3Dsk-...`) is still that key."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter values would blank ordinary words; real keys are far longer
ANYWHERE_SECRET_CHARS = 20  # from this length a value is replaced even inside a longer run of letters and digits
_CHUNK = 1 << 20


def redactable(secret: str | None) -> bool:
    return bool(secret) and len(secret or "") >= MIN_SECRET_CHARS


def short_secrets(values: Mapping[str, str | None]) -> list[str]:
    """The names whose value is set but too short to be redacted safely."""
    return sorted(name for name, value in values.items() if value and not redactable(value))


def short_secrets_note(names: Iterable[str]) -> str | None:
    """What to tell a person about values that will not be redacted, or None."""
    names = sorted(names)
    if not names:
        return None
    which = ", ".join(names)
    return (f"{which} {'is' if len(names) == 1 else 'are'} shorter than {MIN_SECRET_CHARS} characters: too short to "
            "redact safely (it would be cut out of ordinary words), so agl does not redact it from what it records; "
            "a real key is longer, and a placeholder can be too (e.g. dev-placeholder-key)")


def _alternative(secret: str) -> str:
    body = re.escape(secret)
    if len(secret) >= ANYWHERE_SECRET_CHARS:
        return body
    # Not preceded or followed by a letter or digit where the value itself starts or ends with one.
    head = r"(?<![^\W_])" if secret[0].isalnum() else ""
    tail = r"(?![^\W_])" if secret[-1].isalnum() else ""
    return head + body + tail


@functools.lru_cache(maxsize=256)
def secret_pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern for the redactable values, longest first (a key that contains another is replaced whole)."""
    unique = sorted({s for s in secrets if redactable(s)}, key=len, reverse=True)
    return re.compile("|".join(_alternative(s) for s in unique)) if unique else None


def redact_text(text: str, secrets: tuple[str, ...]) -> str:
    pattern = secret_pattern(secrets)
    return pattern.sub(REDACTED, text) if pattern is not None and text else text


def _bytes_pattern(pattern: re.Pattern[str]) -> re.Pattern[bytes]:
    return re.compile(pattern.pattern.encode())


class Redactor:
    def __init__(self, secrets: Iterable[str | None]) -> None:
        unique = {s for s in secrets if s and redactable(s)}
        self.secrets = tuple(sorted(unique, key=len, reverse=True))
        self._encoded = tuple(s.encode() for s in self.secrets)
        pattern = secret_pattern(self.secrets)
        self._pattern = _bytes_pattern(pattern) if pattern is not None else None

    def with_secret(self, secret: str | None) -> Redactor:
        return Redactor((*self.secrets, secret))

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def text(self, value: str | None) -> str | None:
        if not value:
            return value
        return redact_text(value, self.secrets)

    def value(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string redacted (keys included)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value

    def file(self, path: Path) -> bool:
        """Redact a file in place, a chunk at a time (an output file may be huge); True when it held a secret."""
        if self._pattern is None or not self._contains_secret(path):
            return False
        # A match must end before the buffer does, so the character after it (a word's next letter) is seen.
        keep = max(len(s) for s in self._encoded)
        tmp = path.with_name(path.name + ".redacting")
        with path.open("rb") as src, tmp.open("wb") as dst:
            before = b""  # the last byte written: what a match at the buffer's start is preceded by
            pending = b""
            while chunk := src.read(_CHUNK):
                buffer = before + pending + chunk
                safe = len(buffer) - keep  # a match starting before here lies wholly in the buffer
                position = len(before)
                for match in self._pattern.finditer(buffer, position):
                    if match.start() >= safe:
                        break
                    dst.write(buffer[position : match.start()])
                    dst.write(REDACTED.encode())
                    position = match.end()
                cut = max(position, safe)
                dst.write(buffer[position:cut])
                before, pending = buffer[max(cut - 1, 0):cut], buffer[cut:]
            buffer, position = before + pending, len(before)
            for match in self._pattern.finditer(buffer, position):
                dst.write(buffer[position : match.start()])
                dst.write(REDACTED.encode())
                position = match.end()
            dst.write(buffer[position:])
        os.replace(tmp, path)
        return True

    def _contains_secret(self, path: Path) -> bool:
        keep = max(len(s) for s in self._encoded) - 1
        with path.open("rb") as fh:
            tail = b""
            while chunk := fh.read(_CHUNK):
                buffer = tail + chunk
                if any(s in buffer for s in self._encoded):
                    return True
                tail = buffer[-keep:] if keep else b""
        return False
