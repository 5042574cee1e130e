"""The row formats of the run store: a model call (`CallRecord`) and a rollout (`Rollout`) to and from their SQLite
rows. Defined once here, used by every writer (the gateway's batched writer, the store's own inserts) and every
reader, so a call reads back as it was written whichever path stored it.

JSON columns are compact UTF-8 (orjson: the gateway encodes rows on its hot path). Non-finite floats, which orjson
would silently write as null, are written as JSON's `Infinity`/`NaN` extensions that Python reads back: a sampled
token can have a logprob of -inf, and a null in `logprobs` would make the call unreadable.
"""

from __future__ import annotations

import enum
import json
import math
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from rl_backend.store.records import CallRecord, Rollout
from rl_backend.store.redact import redact_text, redactable

CALL_COLUMNS = tuple(CallRecord.model_fields)
_CALL_JSON = frozenset({"request", "response", "prompt_token_ids", "completion_token_ids", "logprobs", "knobs_applied"})
# A call id seen before is ignored: a retried write is harmless.
INSERT_CALL = f"INSERT OR IGNORE INTO calls ({', '.join(CALL_COLUMNS)}) VALUES ({', '.join('?' for _ in CALL_COLUMNS)})"

ROLLOUT_COLUMNS = tuple(Rollout.model_fields)
_ROLLOUT_JSON = frozenset({"grader_detail"})
# A rollout is written again as it moves from queued to running to finished.
PUT_ROLLOUT = (f"INSERT OR REPLACE INTO rollouts ({', '.join(ROLLOUT_COLUMNS)}) "
               f"VALUES ({', '.join('?' for _ in ROLLOUT_COLUMNS)})")


def dump_json(value: Any) -> str:
    """Compact JSON text of a JSON-like value."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # what orjson refuses (integers past 64 bits, non-string keys): the standard library takes it
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def load_json(text: str | bytes | None) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # Infinity and NaN (see the module doc), which the standard library reads
        return json.loads(text)


def _redact(text: str, secrets: Sequence[str], *, json_text: bool) -> str:
    """Whole secret values only (rl_backend.store.redact says which: never a short value, never inside a word). In
    JSON text a secret appears as a JSON string would spell it."""
    spelled = tuple(orjson.dumps(s).decode()[1:-1] if json_text else s for s in secrets if redactable(s))
    return redact_text(text, spelled) if spelled else text


def encode_call(record: CallRecord, secrets: Sequence[str] = ()) -> tuple[Any, ...]:
    """The `calls` row of a record, in CALL_COLUMNS order: JSON text for dicts and lists, enum values, bools as 0/1;
    the `secrets` (upstream keys, a rollout's token) an agent echoed into a request, or an upstream into a response
    or an error, are redacted."""
    row: list[Any] = []
    for name in CALL_COLUMNS:
        value = getattr(record, name)
        if name == "logprobs" and value is not None and not all(map(math.isfinite, value)):
            value = json.dumps(value, separators=(",", ":"))
        elif isinstance(value, dict | list):
            value = dump_json(value)
            if secrets and name in ("request", "response"):
                value = _redact(value, secrets, json_text=True)
        elif isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, bool):
            value = int(value)
        elif secrets and name == "error" and value:
            value = _redact(value, secrets, json_text=False)
        row.append(value)
    return tuple(row)


def decode_call(row: sqlite3.Row | Mapping[str, Any]) -> CallRecord:
    """A CallRecord from a `calls` row (`SELECT *`; columns a store of an older schema lacks take their defaults)."""
    data = {name: row[name] for name in row.keys() if name in CallRecord.model_fields}  # noqa: SIM118 - sqlite3.Row
    for name in _CALL_JSON & data.keys():
        data[name] = load_json(data[name])
    if data.get("knobs_applied") is None:
        data["knobs_applied"] = {}
    if data.get("request") is None:
        data["request"] = {}
    data["stream"] = bool(data.get("stream"))
    return CallRecord.model_validate(data)


def encode_rollout(rollout: Rollout) -> tuple[Any, ...]:
    """The `rollouts` row of a rollout, in ROLLOUT_COLUMNS order."""
    data = rollout.model_dump(mode="json")
    return tuple(dump_json(data[n]) if n in _ROLLOUT_JSON and data[n] is not None else data[n]
                 for n in ROLLOUT_COLUMNS)


def decode_rollout(row: sqlite3.Row | Mapping[str, Any]) -> Rollout:
    data = {name: row[name] for name in row.keys() if name in Rollout.model_fields}  # noqa: SIM118 - sqlite3.Row
    for name in _ROLLOUT_JSON & data.keys():
        data[name] = load_json(data[name])
    return Rollout.model_validate(data)


TRAIN_STEP_COLUMNS = (
    "step", "model_version", "updated", "started_at", "ended_at", "rollouts", "trained_rollouts", "reward_mean",
    "pass_rate", "entropy", "kl", "loss", "grad_norm", "tokens_per_s", "rollouts_per_min", "staleness_mean",
    "staleness_max", "checkpoint", "metrics",
)
INSERT_TRAIN_STEP = (f"INSERT INTO train_steps ({', '.join(TRAIN_STEP_COLUMNS)}) "
                     f"VALUES ({', '.join('?' for _ in TRAIN_STEP_COLUMNS)})")


def _finite(value: Any) -> Any:
    """NaN and infinities as None, all the way down: a metric that could not be computed is stored as missing."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def encode_train_step(values: Mapping[str, Any]) -> tuple[Any, ...]:
    """The `train_steps` row of one training iteration (`metrics`: a JSON object of everything else)."""
    row = [_finite(values.get(name)) for name in TRAIN_STEP_COLUMNS]
    row[TRAIN_STEP_COLUMNS.index("updated")] = int(bool(values["updated"]))
    row[-1] = json.dumps(_finite(values.get("metrics") or {}), default=str)
    return tuple(row)


def decode_train_step(row: sqlite3.Row | Mapping[str, Any]) -> dict[str, Any]:
    data = {name: row[name] for name in TRAIN_STEP_COLUMNS}
    data["updated"] = bool(data["updated"])
    data["metrics"] = load_json(data["metrics"])
    return data
