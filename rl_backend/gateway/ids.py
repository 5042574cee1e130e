"""Rollout ids as the gateway accepts them: they travel in URL paths, file names and logs, so only a safe
alphabet and length get in."""

from __future__ import annotations

import re

ROLLOUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def check_rollout_id(rollout_id: object) -> str:
    """The id itself, or ValueError saying what an id may contain."""
    if not isinstance(rollout_id, str) or not ROLLOUT_ID.fullmatch(rollout_id) or ".." in rollout_id:
        raise ValueError(
            f"rollout id {shown_id(rollout_id)} is not allowed: use 1 to 128 letters, digits, `.`, `_`, `:` or `-`, "
            "starting with a letter or digit, without `..`"
        )
    return rollout_id


def shown_id(rollout_id: object) -> str:
    """The id quoted for a message, cut when long (an id that was refused may be 60 KB)."""
    text = repr(rollout_id)
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"
