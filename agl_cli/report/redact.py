"""Secrets removed from everything a report shows: transcripts, outputs, errors.

The gateway already replaces the keys it knows; a report may still meet keys it never knew (an agent that pastes
its own key into a prompt, a tool result that echoes an env dump), and a report is made to be shared. So
anything that *looks* like a credential goes: values under credential-like names, bearer tokens, and the shapes
of well-known keys.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"

# Dict keys whose values are credentials whatever they look like.
_SECRET_KEY = re.compile(
    r"^(authorization|proxy-authorization|x-api-key|api[-_]?key|apikey|access[-_]?token|refresh[-_]?token|"
    r"secret|client[-_]?secret|password|passwd|cookie|set-cookie|x-goog-api-key|token|id[-_]?token|"
    r"[a-z0-9_]*_(api_key|token|secret|password))$",
    re.IGNORECASE,
)

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # Authorization header values and bearer tokens anywhere in text.
    (re.compile(r"(?i)\b(authorization\s*[:=]\s*)(\"?)[^\s\"',;]+(?:\s+[^\s\"',;]+)?"), r"\1\2" + REDACTED),
    # The token after the scheme must look like one (a digit or one of ._~+/=-, mixed case, or 24+ letters):
    # "a basic configuration" is English, not a credential.
    (re.compile(r"\b([Bb]earer|[Bb]asic|BEARER|BASIC)\s+(?=[A-Za-z]*[0-9._~+/=-]|[A-Za-z]*[a-z][A-Za-z]*[A-Z]|"
                r"[A-Za-z]{24})[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    # OpenAI / Anthropic style keys: sk-..., sk-proj-..., sk-ant-...
    (re.compile(r"\bsk-[A-Za-z0-9_-]{6,}"), "sk-" + REDACTED),
    # agl's own per-rollout gateway tokens.
    (re.compile(r"\bagl-[A-Za-z0-9_-]{16,}"), "agl-" + REDACTED),
    # Well-known shapes: GitHub, AWS access key ids, Google API keys, Slack, Hugging Face, JWTs.
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    # KEY=value written inside text (env dumps, config echoes); a number is a setting (MAX_TOKENS=1000), kept.
    (
        re.compile(r"\b([A-Z][A-Z0-9_]*(?:API_KEY|APIKEY|SECRET|TOKEN|PASSWORD)[A-Z0-9_]*)(\"?\s*[:=]\s*\"?)"
                   r"(?!\d+\b)([^\s\"',;]{4,})"),
        r"\1\2" + REDACTED,
    ),
    (
        re.compile(r"(?i)\b(api[_-]?key|access[_-]?token|auth[_-]?token|client[_-]?secret|secret[_-]?key|password)"
                   r"(\"?\s*[:=]\s*\"?)(?!\d+\b)([^\s\"',;]{4,})"),
        r"\1\2" + REDACTED,
    ),
]


def scrub_text(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def scrub(value: Any) -> Any:
    """A copy of a JSON-like value with credential-named fields blanked and credential-shaped text replaced."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {
            k: (REDACTED if isinstance(k, str) and _SECRET_KEY.match(k) and v not in (None, "") else scrub(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value
