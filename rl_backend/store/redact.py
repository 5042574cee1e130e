"""Removing known secret values (the upstream API keys agl holds, a rollout's own token) from what agl writes about
a rollout: its stored output, stdout and stderr tails, errors, grader detail, and its output file.

Unlike the report's pattern-based scrub, this knows the exact values, so a key of any format is caught."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter values would blank ordinary words; real keys are far longer
_CHUNK = 1 << 20


class Redactor:
    def __init__(self, secrets: Iterable[str | None]) -> None:
        unique = {s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}
        # Longest first, so a key that contains another is replaced whole.
        self.secrets = tuple(sorted(unique, key=len, reverse=True))
        self._encoded = tuple(s.encode() for s in self.secrets)
        self._pattern = re.compile(b"|".join(re.escape(s) for s in self._encoded)) if self._encoded else None

    def with_secret(self, secret: str | None) -> Redactor:
        return Redactor((*self.secrets, secret))

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def text(self, value: str | None) -> str | None:
        if not value:
            return value
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value

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
        keep = max(len(s) for s in self._encoded) - 1
        tmp = path.with_name(path.name + ".redacting")
        with path.open("rb") as src, tmp.open("wb") as dst:
            pending = b""
            while chunk := src.read(_CHUNK):
                buffer = pending + chunk
                safe = len(buffer) - keep  # a match starting before here lies wholly in the buffer
                position = 0
                for match in self._pattern.finditer(buffer):
                    if match.start() >= safe:
                        break
                    dst.write(buffer[position : match.start()])
                    dst.write(REDACTED.encode())
                    position = match.end()
                cut = max(position, safe)
                dst.write(buffer[position:cut])
                pending = buffer[cut:]
            dst.write(self._pattern.sub(REDACTED.encode(), pending))
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
