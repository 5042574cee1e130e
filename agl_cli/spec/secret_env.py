"""The environment variables whose values are secrets agl keeps out of everything it records (the upstreams' API
keys), and the note, said once per run, when one is too short to be redacted safely (rl_backend.store.redact)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from agl_cli.spec.schema import ExperimentSpec
from rl_backend.store.redact import short_secrets, short_secrets_note

SECRET_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")


def secret_names(spec: ExperimentSpec) -> set[str]:
    return set(SECRET_ENV) | {u.api_key_env for u in spec.upstreams.values() if u.api_key_env}


def secret_values(spec: ExperimentSpec, environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    environ = os.environ if environ is None else environ
    return {name: environ.get(name) for name in secret_names(spec)}


def short_secret_note(spec: ExperimentSpec, environ: Mapping[str, str] | None = None) -> str | None:
    """Why a configured key will show in transcripts unredacted, or None when every set key is redacted."""
    return short_secrets_note(short_secrets(secret_values(spec, environ)))
