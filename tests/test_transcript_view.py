"""The model's reply in view: a triage agent that misreads hedged replies (it takes the first label named) runs
through the gateway; `agl transcript RUN --failing --replies-only` then shows every failing rollout's last reply
beside the agent's output in one call, `agl transcript RUN ROLLOUT` one whole transcript (`--raw`: the stored
records), and the skill's `failures.py --replies` the same reply per example. stdout is piped, as a coding agent
reads it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agl_cli.main import app
from agl_cli.report import transcripts
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY
from rl_backend.store.records import Api, CallRecord
from tests.helpers import FIXTURES, REPO, agl_env, run_agl

SCRIPTS = REPO / "skills" / "agent-lightning" / "scripts"
TICKETS = [
    ("I was charged twice this month", "billing", "billing"),
    ("Cannot log in after the password reset", "account_access", "Not billing: this is account_access."),
    ("Where is my parcel?", "shipping", "shipping"),
    ("My login code never arrives", "account_access", "It looks like billing at first, but it is account_access."),
]


@pytest.fixture(scope="module")
def triage_run(tmp_path_factory: pytest.TempPathFactory, fake_server: FakeUpstream) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("triage")
    shutil.copy(FIXTURES / "hedged_triage_agent.py", folder / "hedged_triage_agent.py")
    tasks = [{"id": f"t{i}", "ticket": t, "label": label, "reply": reply} for i, (t, label, reply) in enumerate(TICKETS)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (folder / "agl.yaml").write_text(yaml.safe_dump({
        "name": "triage",
        "agent": {"command": "python hedged_triage_agent.py {task_file} {output_file}", "timeout_s": 30},
        "tasks": {"path": "tasks.jsonl"},
        "grader": {"entry": "hedged_triage_agent:grade"},
        "upstreams": {"hosted": {"kind": "openai-compatible", "base_url": fake_server.base_url, "api_key_env": "FAKE_KEY"}},
        "model": "hosted/gpt-4o-mini",
    }, sort_keys=False))
    doc = json.loads(run_agl(["eval", "agl.yaml", "--json", "-q", "--no-report"], cwd=folder,
                             env={"FAKE_KEY": UPSTREAM_KEY}, check=True).stdout)
    assert doc["variants"][0]["accuracy"]["mean"] == 0.5
    return folder, doc["run_id"]


def test_every_failing_reply_in_one_call(triage_run: tuple[Path, str]) -> None:
    folder, run_id = triage_run
    doc = json.loads(run_agl(["transcript", run_id, "--failing", "--replies-only", "--json"], cwd=folder,
                             check=True).stdout)
    assert doc["matched"] == doc["shown"] == 2
    by_task = {r["task_id"]: r for r in doc["rollouts"]}
    assert by_task["t1"]["last_reply"] == "Not billing: this is account_access."
    assert by_task["t3"]["last_reply"] == "It looks like billing at first, but it is account_access."
    assert all(json.loads(r["output"]) == {"label": "billing"} and r["reward"] == 0.0 for r in by_task.values())
    assert all("calls" not in r for r in doc["rollouts"]), "--replies-only carries no whole transcript"

    text = run_agl(["transcript", run_id, "--failing", "--replies-only"], cwd=folder, check=True).stdout
    assert text.count("last reply:") == 2 and "Not billing: this is account_access." in text
    assert '{"label": "billing"}' in text and "t0" not in text  # the passing rollouts are left out


def test_one_rollout_whole_transcript(triage_run: tuple[Path, str]) -> None:
    folder, run_id = triage_run
    listing = json.loads(run_agl(["transcript", run_id, "--task", "t1", "--json"], cwd=folder, check=True).stdout)
    rollout_id = listing["rollouts"][0]["rollout_id"]
    doc = json.loads(run_agl(["transcript", run_id, rollout_id[:8], "--json"], cwd=folder, check=True).stdout)
    (only,) = doc["rollouts"]
    turns = [(t["role"], t["text"]) for t in only["calls"][0]["turns"]]
    assert turns[0] == ("system", "Label the ticket: billing, account_access, shipping")
    assert turns[-1] == ("assistant", "Not billing: this is account_access.")
    assert only["last_reply"] == "Not billing: this is account_access."


def test_raw_transcript_is_the_stored_records_without_secrets(triage_run: tuple[Path, str]) -> None:
    folder, run_id = triage_run
    doc = json.loads(run_agl(["transcript", run_id, "--task", "t1", "--raw", "--json"], cwd=folder, check=True).stdout)
    (only,) = doc["rollouts"]
    assert only["task"]["ticket"] == "Cannot log in after the password reset"
    assert only["rollout"]["task_id"] == "t1" and only["rollout"]["reward"] == 0.0 and only["rollout"]["duration_s"] > 0
    (call,) = only["calls"]
    assert call["api"] == "openai.chat" and call["request"]["messages"][0]["role"] == "system"
    assert call["response"]["choices"][0]["message"]["content"] == "Not billing: this is account_access."
    assert "logprobs" not in call and UPSTREAM_KEY not in json.dumps(doc)
    refused = CliRunner().invoke(app, ["transcript", run_id, "--raw", "--runs-dir", str(folder / ".agl" / "runs")])
    assert refused.exit_code == 2 and "--raw goes with --json" in refused.output


def test_failures_script_shows_the_reply(triage_run: tuple[Path, str]) -> None:
    folder, run_id = triage_run
    result = subprocess.run([sys.executable, str(SCRIPTS / "failures.py"), run_id, "--replies"], cwd=folder,
                            capture_output=True, text=True, timeout=60, check=True, env=agl_env())
    doc = json.loads(result.stdout)
    replies = {f["task_id"]: f["last_reply"] for f in doc["failures"]}
    assert replies == {"t1": "Not billing: this is account_access.",
                       "t3": "It looks like billing at first, but it is account_access."}
    assert f"agl transcript {run_id} --failing --replies-only --json" in doc["next"]
    without = json.loads(subprocess.run([sys.executable, str(SCRIPTS / "failures.py"), run_id], cwd=folder,
                                        capture_output=True, text=True, timeout=60, check=True, env=agl_env()).stdout)
    assert all("last_reply" not in f for f in without["failures"])


def test_the_reports_failure_examples_carry_the_reply(triage_run: tuple[Path, str]) -> None:
    folder, run_id = triage_run
    run_agl(["report", run_id, "--format", "md"], cwd=folder, check=True)
    text = (folder / ".agl" / "runs" / run_id / "report" / "report.md").read_text()
    assert "wrong answer: reward 0; last model reply: “Not billing: this is account\\_access.”" in text


def test_usage_errors_exit_2(triage_run: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, run_id = triage_run
    monkeypatch.chdir(folder)
    runner = CliRunner()
    both = runner.invoke(app, ["transcript", run_id, "r", "--failing"])
    assert both.exit_code == 2 and "not both" in both.output
    nothing = runner.invoke(app, ["transcript", run_id, "zzz"])
    assert nothing.exit_code == 2 and "matches 0 rollouts" in nothing.output
    assert runner.invoke(app, ["transcript", run_id, "--limit", "0"]).exit_code == 2
    assert runner.invoke(app, ["transcript", "no-such-run"]).exit_code == 2


# -- a reply is read from every API's response (the skill's scripts read it through agl, never on their own) ------


RESPONSES: list[tuple[Api, dict[str, Any]]] = [
    (Api.openai_chat, {"choices": [{"message": {"role": "assistant", "content": "billing, or maybe not"}}]}),
    (Api.openai_chat, {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"id\": 7}"}}]}}]}),
    (Api.anthropic_messages, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "account_access"},
        {"type": "tool_use", "id": "t", "name": "lookup", "input": {"id": 7}}]}),
    (Api.openai_responses, {"output": [{"type": "reasoning", "summary": []},
                                       {"type": "message", "role": "assistant",
                                        "content": [{"type": "output_text", "text": "shipping"}]},
                                       {"type": "function_call", "name": "lookup", "arguments": "{}"}]}),
    (Api.openai_completions, {"choices": [{"text": " billing"}]}),
    (Api.openai_chat, {"error": {"message": "rate limited"}}),
]


@pytest.mark.parametrize(("api", "response"), RESPONSES)
def test_a_reply_is_read_from_every_apis_response(api: Api, response: dict[str, Any]) -> None:
    call = CallRecord(call_id="c", rollout_id="r", api=api, upstream="u", response=response)
    assert bool(transcripts.reply_text(call)) is ("error" not in response)
