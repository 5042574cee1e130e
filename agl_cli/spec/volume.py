"""The user's volume: how many tasks the agent handles in production (`volume:` in agl.yaml, `--volume 40000/month`).

At a volume, a cost per task becomes a cost per month (agl_cli.metrics.cost). A volume given per day, week or year
is turned into tasks per month with the calendar's average month (365.25 / 12 days).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agl_cli.errors import UsageError

Period = Literal["day", "week", "month", "year"]
DAYS_PER_MONTH = 365.25 / 12
PER_MONTH: dict[str, float] = {"day": DAYS_PER_MONTH, "week": DAYS_PER_MONTH / 7, "month": 1.0, "year": 1 / 12}
FORMS = "`40000/month` (or /day, /week, /year), or {tasks: 40000, per: month}"
_TEXT = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*(?:tasks?\s*)?(?:/|per\s+)\s*([a-z]+?)s?\s*$", re.IGNORECASE)


class Volume(BaseModel):
    """`volume:`: the tasks the agent handles in production, to project cost per task to cost per month."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    tasks: float = Field(gt=0, description="how many tasks (tickets, requests, documents...) per period")
    per: Period = Field(default="month", description="the period: day, week, month or year")

    @property
    def per_month(self) -> float:
        return self.tasks * PER_MONTH[self.per]

    def label(self) -> str:
        """`40,000 tasks/month`; a volume given per day says what that is per month too."""
        text = f"{self.tasks:,.10g} tasks/{self.per}"
        return text if self.per == "month" else f"{text} ({self.per_month:,.0f}/month)"

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "per": self.per, "tasks_per_month": self.per_month}


def volume_input(value: Any) -> Any:
    """`40000/month` as {tasks: 40000, per: month}; a bare number is refused (per what?); anything else as given."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return value
    bare = value if not isinstance(value, str) else _number(value)
    if bare is not None:
        raise ValueError(f"say per what: {bare:g}/month, or {bare:g}/day (the forms: {FORMS})")
    assert isinstance(value, str)
    match = _TEXT.match(value)
    if match is None:
        raise ValueError(f"cannot read {value!r} as a volume; write {FORMS}")
    number, period = match.groups()
    if period.lower() not in PER_MONTH:
        raise ValueError(f"{period!r} is not a period agl knows; write {FORMS}")
    return {"tasks": float(number.replace("_", "").replace(",", "")), "per": period.lower()}


def _number(text: str) -> float | None:
    try:
        return float(text.strip().replace(",", "").replace("_", ""))
    except ValueError:
        return None


def parse_volume(text: str, *, flag: str = "--volume") -> Volume:
    """A volume from the command line, or a usage error that shows the forms."""
    try:
        return Volume.model_validate(volume_input(text))
    except (ValueError, ValidationError) as exc:
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise UsageError(f"{flag} {text!r}: {reason.removeprefix('Value error, ')}",
                         hint=f"for example {flag} 40000/month") from None
