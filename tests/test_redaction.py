"""Secret values are redacted whole, never out of the middle of a word: with OPENAI_API_KEY=dev a transcript once
read "a [redacted]ice misbehaving". A value too short to redact safely is left alone and agl says so, once; a real
key is removed wherever agl records it (calls, outputs, output files)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rl_backend.gateway.fake import FakeUpstream
from rl_backend.store.codec import encode_call
from rl_backend.store.records import Api, CallRecord
from rl_backend.store.redact import MIN_SECRET_CHARS, Redactor, redact_text, short_secrets
from tests.helpers import FIXTURES, run_agl

TICKET = "My dev laptop is a device misbehaving since the last update"
REPLY = "shipping: a device fault, to be sent back"


@pytest.fixture(scope="module")
def dev_key_upstream() -> Iterator[FakeUpstream]:
    """A provider's dev API, whose key is the word `dev`."""
    fake = FakeUpstream(api_key="dev").start()
    yield fake
    fake.stop()


def test_a_short_key_is_not_cut_out_of_words_and_agl_says_why(tmp_path: Path, dev_key_upstream: FakeUpstream) -> None:
    shutil.copy(FIXTURES / "hedged_triage_agent.py", tmp_path / "hedged_triage_agent.py")
    task = {"id": "t0", "ticket": TICKET, "label": "shipping", "reply": REPLY}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({
        "name": "triage",
        "agent": {"command": "python hedged_triage_agent.py {task_file} {output_file}", "timeout_s": 30},
        "tasks": {"path": "tasks.jsonl"},
        "grader": {"entry": "hedged_triage_agent:grade"},
        "upstreams": {"hosted": {"kind": "openai-compatible", "base_url": dev_key_upstream.base_url,
                                 "api_key_env": "OPENAI_API_KEY"}},
        "model": "hosted/gpt-4o-mini",
    }))
    result = run_agl(["eval", "agl.yaml", "--json", "-q"], cwd=tmp_path, env={"OPENAI_API_KEY": "dev"}, check=True)
    doc = json.loads(result.stdout)
    shown = json.loads(run_agl(["transcript", doc["run_id"], "--json"], cwd=tmp_path, check=True).stdout)
    turns = [t["text"] for t in shown["rollouts"][0]["calls"][0]["turns"]]
    assert any(TICKET in t for t in turns) and REPLY in turns, turns
    assert "[redacted]" not in json.dumps(shown)
    note = f"OPENAI_API_KEY is shorter than {MIN_SECRET_CHARS} characters: too short to redact safely"
    assert result.stderr.count(note) == 1, result.stderr
    assert any(note in n for n in doc["notes"])
    report = (Path(doc["run_dir"]) / "report" / "report.md").read_text()
    assert note.replace("_", "\\_") in report  # among the report's caveats (Markdown-escaped)


def test_whole_values_only() -> None:
    key = "k3y-Secret99"  # long enough to redact, short enough to be a piece of a longer word
    text = f"key={key}; Bearer {key}. not xk3y-Secret99 nor {key}s, but ({key})"
    assert redact_text(text, (key,)) == "key=[redacted]; Bearer [redacted]. not xk3y-Secret99 nor k3y-Secret99s, " \
                                       "but ([redacted])"
    # A key of 20+ characters cannot sit inside an ordinary word by chance: it goes wherever it is.
    long_key = "sk-proj-abcdefghijklmnop0123"
    assert redact_text(f"key%3D{long_key}&x={long_key}z", (long_key,)) == "key%3D[redacted]&x=[redacted]z"
    # Too short: never redacted, and named as such.
    assert redact_text("a device in dev mode", ("dev",)) == "a device in dev mode"
    assert short_secrets({"OPENAI_API_KEY": "dev", "ANTHROPIC_API_KEY": None, "OTHER": long_key}) == ["OPENAI_API_KEY"]
    # The store's rows: JSON text of requests and responses, and errors.
    record = CallRecord(call_id="c", api=Api.openai_chat, upstream="u",
                        request={"messages": [{"content": f"the key {key} of a monk3y-Secret99er"}]},
                        response={"echo": "a device"}, error=f"401: bad key {key}")
    row = " ".join(str(v) for v in encode_call(record, (key, "dev")))
    assert row.count("[redacted]") == 2 and "monk3y-Secret99er" in row and "a device" in row


def test_output_files_are_redacted_by_whole_value_across_chunk_boundaries(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import rl_backend.store.redact as redact

    monkeypatch.setattr(redact, "_CHUNK", 16)  # matches straddle every chunk boundary
    key = "k3y-Secret99"
    path = tmp_path / "out.txt"
    words = [f"use {key} here", f"x{key}", f"{key}x", f"({key})", "the device"] * 7
    path.write_text("\n".join(words))
    assert Redactor([key, "dev"]).file(path)
    expected = "\n".join(["use [redacted] here", f"x{key}", f"{key}x", "([redacted])", "the device"] * 7)
    assert path.read_text() == expected
    assert Redactor([key]).text(f"{key}!") == "[redacted]!" and Redactor(["dev"]).text("dev") == "dev"


def test_the_reports_pattern_scrub_leaves_english_alone() -> None:
    """A report's transcripts also go through a scrub of credential shapes: "a basic configuration" once read
    "a basic [redacted]"."""
    from agl_cli.report.redact import scrub_text

    assert scrub_text("a basic configuration question, bearer bonds too") == \
        "a basic configuration question, bearer bonds too"
    assert scrub_text("Authorization: Basic dXNlcjpwYXNzd29yZA==") == "Authorization: [redacted]"
    assert scrub_text("curl -H 'x: Bearer abc.def-123456' and basic dXNlcjpwYXNz") == \
        "curl -H 'x: Bearer [redacted]' and basic [redacted]"
