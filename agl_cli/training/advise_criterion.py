"""One criterion of `agl advise`: what was measured, against which threshold, its status, and what to do first.
Shared by the modules that judge the criteria (advise.py, advise_plateau.py, advise_failures.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PASS, WARN, FAIL, UNKNOWN = "pass", "warn", "fail", "unknown"


@dataclass
class Criterion:
    id: str
    title: str
    status: str
    value: Any
    threshold: str
    detail: str
    hint: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "status": self.status, "value": self.value,
                "threshold": self.threshold, "detail": self.detail, "hint": self.hint}
