"""Shared by the skill's scripts: find agl runs and read their stores. Standard library only, read only.

A run is `.agl/runs/<run-id>/` (or `$AGL_HOME/runs/<run-id>/`) holding `manifest.json` and `store.sqlite`.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any, NoReturn

TERMINAL = ("succeeded", "failed", "timed_out")


def fail(message: str, code: int = 2) -> NoReturn:
    """Usage errors go to stderr as JSON too, so a calling agent can parse every outcome."""
    sys.stderr.write(json.dumps({"error": message}) + "\n")
    raise SystemExit(code)


def runs_root(runs_dir: str | None) -> Path:
    if runs_dir:
        return Path(runs_dir).expanduser()
    home = os.environ.get("AGL_HOME")
    return (Path(home) if home else Path.cwd() / ".agl") / "runs"


def find_run(reference: str, runs_dir: str | None) -> Path:
    """A run folder by path, id, unique id prefix, or `latest` (the newest, by id)."""
    as_path = Path(reference).expanduser()
    if (as_path / "manifest.json").is_file():
        return as_path
    root = runs_root(runs_dir)
    runs = sorted(p for p in root.glob("*") if (p / "manifest.json").is_file()) if root.is_dir() else []
    if not runs:
        fail(f"no runs under {root}; run `agl eval` first, or pass --runs-dir")
    if reference == "latest":
        return runs[-1]
    matches = [p for p in runs if p.name == reference] or [p for p in runs if p.name.startswith(reference)]
    if len(matches) != 1:
        fail(f"{reference!r} matches {len(matches)} runs under {root}")
    return matches[0]


def manifest(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "manifest.json").read_text())
    return data


def connect(run: Path) -> sqlite3.Connection:
    path = run / "store.sqlite"
    if not path.is_file():
        fail(f"{run} has no store.sqlite")
    conn = sqlite3.connect(path, timeout=30.0)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA query_only=1")  # these scripts never change a run
    return conn


def reused_ids(conn: sqlite3.Connection) -> set[str]:
    """Ids of the rollouts a run copied from earlier runs (agl's result cache): paid for there, not here."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'cache_imported'").fetchone()
    except sqlite3.OperationalError:  # a store from before the meta table
        return set()
    return set(json.loads(row[0])) if row else set()


def latest_rollouts(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The newest attempt of each (variant, task, seed), in creation order."""
    newest: dict[str, dict[str, Any]] = {}
    for row in conn.execute("SELECT * FROM rollouts ORDER BY rowid"):
        item = dict(row)
        old = newest.get(item["key"])
        if old is None or item["attempt"] >= old["attempt"]:
            newest[item["key"]] = item
    return list(newest.values())


# -- the model's reply, as text, from a recorded call (the same reading as `agl transcript`) ----------------------


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return _dump(content)
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict):
            kind = part.get("type", "")
            if isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif kind == "tool_use":
                parts.append(f"[tool call {part.get('name')}] {_dump(part.get('input'))}")
            elif kind in ("thinking", "redacted_thinking", "reasoning"):
                parts.append("[reasoning]")
            else:
                parts.append(_dump(part))
    return "\n".join(p for p in parts if p)


def _chat_message(message: dict[str, Any]) -> str:
    calls = [f"[tool call {(c.get('function') or {}).get('name')}] {(c.get('function') or {}).get('arguments', '')}"
             for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    return "\n".join(t for t in (_content_text(message.get("content")), "\n".join(calls)) if t)


def _responses_item(item: Any) -> str:
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        return _dump(item)
    kind = item.get("type", "message")
    if kind == "function_call":
        return f"[tool call {item.get('name')}] {item.get('arguments', '')}"
    if kind == "function_call_output":
        return _content_text(item.get("output"))
    if kind == "reasoning":
        return "[reasoning]"
    return _content_text(item.get("content"))


def reply_text(api: str, response: Any) -> str | None:
    """What the model answered in one call (tool calls included); None when the call has no answer."""
    if not isinstance(response, dict) or not response:
        return None
    if "error" in response and not response.get("choices") and not response.get("content"):
        return None
    if api == "openai.chat":
        texts = [_chat_message(c.get("message") or c.get("delta") or {}) for c in response.get("choices", [])]
    elif api == "anthropic.messages":
        texts = [_content_text(response.get("content"))]
    elif api == "openai.responses":
        texts = [_responses_item(i) for i in response.get("output", [])]
    elif api == "openai.completions":
        texts = [str(c.get("text", "")) for c in response.get("choices", [])]
    else:
        texts = [_dump(response)]
    text = "\n".join(t for t in texts if t)
    return text or None


def last_reply(conn: sqlite3.Connection, rollout_id: str) -> str | None:
    """The model's last answer in a rollout: what the agent had to read its result from."""
    rows = conn.execute("SELECT api, response FROM calls WHERE rollout_id = ? ORDER BY seq DESC", (rollout_id,))
    for row in rows:
        try:
            response = json.loads(row["response"]) if row["response"] else None
        except ValueError:
            continue
        text = reply_text(row["api"], response)
        if text is not None:
            return text
    return None


def clip(text: Any, limit: int) -> Any:
    """Long text keeps its head and its tail, where errors and final answers usually are."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return text[:half] + f"\n... [{len(text) - 2 * half} characters cut] ...\n" + text[-half:]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def emit(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
