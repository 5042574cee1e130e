"""`agl optimize --strategy reflect`: the per-task Pareto front and parent choice (by hand), the proposer's reply
handling, and whole studies of the synthetic agent against a scripted OpenAI-compatible proposer served over real
HTTP on 127.0.0.1 (a good proposal kept, bad ones rejected with their reason, a resume that asks nothing twice),
plus one study whose proposer is the embedded SmolLM2 model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from agl_cli.optimize.pareto import choose_parent, dominates, pareto_front, task_means
from agl_cli.optimize.proposer import check_proposal, extract_prompt, render_transcript
from rl_backend.store.records import Api, CallRecord, Rollout, RolloutStatus
from tests.helpers import FIXTURES, agl_env, invoke_agl, run_agl

BASE_PROMPT = "Answer the question."
KEY_ENV = {"SCRIPTED_KEY": "sk-scripted-test"}

# -- the Pareto front and the parent, by hand ------------------------------------------------------------------


def test_front_keeps_the_undominated_best_on_some_task() -> None:
    candidates = {
        "A": {"t1": 1.0, "t2": 0.0, "t3": 0.0, "t4": 1.0},
        "B": {"t1": 0.0, "t2": 1.0, "t3": 0.0, "t4": 1.0},
        "C": {"t1": 1.0, "t2": 0.0, "t3": 0.0, "t4": 0.0},  # ties A's best on t1, but A is as good everywhere
        "D": {"t1": 0.0, "t2": 0.0, "t3": 0.0, "t4": 0.0},  # best only on t3, where everyone ties
        "E": {},  # nothing scored yet
    }
    front = pareto_front(candidates)
    # Wins: t1 -> A, C; t2 -> B; t3 -> A, B, C, D (a tie); t4 -> A, B. C and D are dominated by A.
    assert front.members == ["A", "B"] and front.wins == {"A": 3, "B": 3}
    assert dominates(candidates["A"], candidates["C"]) and not dominates(candidates["A"], candidates["B"])
    assert not dominates(candidates["A"], candidates["A"])  # equal is not better
    # Middle of the road on every task, best on none: not on the front (GEPA keeps per-task winners).
    middling = pareto_front({"A": {"t1": 1.0, "t2": 0.0}, "B": {"t1": 0.0, "t2": 1.0}, "M": {"t1": 0.6, "t2": 0.6}})
    assert middling.members == ["A", "B"]
    assert pareto_front({"only": {"t1": 0.0}}).members == ["only"]  # a lone candidate is its own front
    assert task_means({("t1", 0): 1.0, ("t1", 1): 0.0, ("t2", 0): 1.0}) == {"t1": 0.5, "t2": 1.0}


class _Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_parent_is_drawn_in_proportion_to_tasks_won_and_replays_with_its_seed() -> None:
    import random

    front = pareto_front({"A": {"t1": 1.0, "t2": 1.0, "t3": 1.0, "t4": 0.0}, "B": {"t1": 0.0, "t2": 0.0, "t3": 0.0,
                                                                                    "t4": 1.0}})
    assert front.wins == {"A": 3, "B": 1}
    # A point in [0, 4): [0, 3) is A, [3, 4) is B.
    assert [choose_parent(front, _Fixed(u)) for u in (0.0, 0.7, 0.749, 0.75, 0.99)] == ["A", "A", "A", "B", "B"]
    draws = Counter(choose_parent(front, random.Random(i)) for i in range(4000))
    assert 0.72 < draws["A"] / 4000 < 0.78
    assert choose_parent(front, random.Random("reflect:0:3")) == choose_parent(front, random.Random("reflect:0:3"))
    with pytest.raises(ValueError, match="empty"):
        choose_parent(pareto_front({}), _Fixed(0.5))


# -- what counts as a proposal ---------------------------------------------------------------------------------


def test_reply_parsing_and_rejection_reasons() -> None:
    assert extract_prompt("Here:\n<prompt>\nBe brief.\n</prompt>") == ("Be brief.", None)
    assert extract_prompt("e.g. <prompt>x</prompt> ... final: <prompt>Be exact.</prompt>")[0] == "Be exact."
    assert extract_prompt("```markdown\nUse tools.\n```")[0] == "Use tools."
    assert extract_prompt("Just answer in French.")[0] == "Just answer in French."
    assert extract_prompt("<prompt>cut in the mid")[1] == (
        "the reply opens <prompt> but never closes it (cut at proposer.max_tokens?)")
    assert extract_prompt("   ") == (None, "the reply holds no prompt (empty)")
    assert extract_prompt("<prompt> </prompt>")[1] == "the reply holds no prompt (empty)"
    assert check_proposal("Answer  the\nquestion.", BASE_PROMPT, {}, 100) == "identical to its parent"
    assert check_proposal("x" * 101, BASE_PROMPT, {}, 100) == (
        "too long: 101 characters, more than proposer.max_prompt_chars (100)")
    assert check_proposal("Be careful.", BASE_PROMPT, {"prompt=v2": "Be careful."}, 100) == "the same text as prompt=v2"
    assert check_proposal("Be careful.", BASE_PROMPT, {}, 100) is None


def test_transcript_shows_each_message_once_and_the_grade() -> None:
    rollout = Rollout(id="r1", key="k", variant="baseline", task_id="t7", status=RolloutStatus.succeeded,
                      reward=0.0, output="wrong", grader_detail={"expected": "right"})
    first = {"messages": [{"role": "system", "content": BASE_PROMPT}, {"role": "user", "content": "q?"}]}
    second = {"messages": [*first["messages"], {"role": "assistant", "content": "thinking"},
                           {"role": "user", "content": "and?"}]}
    calls = [
        CallRecord(call_id="c1", rollout_id="r1", api=Api.openai_chat, upstream="u", request=first,
                   response={"choices": [{"message": {"content": "thinking"}}]}),
        CallRecord(call_id="c2", rollout_id="r1", api=Api.openai_chat, upstream="u", request=second,
                   response={"choices": [{"message": {"content": "wrong"}}]}),
    ]
    text = render_transcript(rollout, {"id": "t7", "q": "?"}, calls, 4000)
    assert text.count(f"[system] {BASE_PROMPT}") == 1 and text.count("[user] q?") == 1 and "[user] and?" in text
    assert "agent output: wrong" in text and '"expected": "right"' in text and '"id": "t7"' in text
    short = render_transcript(rollout, {"id": "t7", "blob": "z" * 5000}, calls, 600)
    assert len(short) < 700 and "characters cut" in short and short.rstrip().endswith('{"expected": "right"}')


# -- a scripted proposer over real HTTP ------------------------------------------------------------------------


class ScriptedLLM:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1. The agent's model (`agent-model`) always answers
    "ok"; the proposer's calls get the scripted replies in order: a string, an int (that HTTP error), or "HOLD"
    (answer only once `release` is set, with an error)."""

    def __init__(self, script: list[str | int]) -> None:
        self.script = list(script)
        self.proposer_requests: list[dict[str, Any]] = []
        self.agent_calls = 0
        self.holding = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, payload = outer.answer(self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path != "/v1/chat/completions":
            return 404, {"error": {"message": f"no route {path}"}}
        if body.get("model") == "agent-model":
            with self.lock:
                self.agent_calls += 1
            return 200, _completion(body["model"], "ok", 30, 2)
        with self.lock:
            self.proposer_requests.append(body)
            step = self.script.pop(0) if self.script else 400
        if step == "HOLD":
            self.holding.set()
            self.release.wait(30)
            return 400, {"error": {"message": "released", "type": "invalid_request_error"}}
        if isinstance(step, int):
            return step, {"error": {"message": "scripted failure", "type": "invalid_request_error"}}
        return 200, _completion(body["model"], step, 1200, 300)

    def __enter__(self) -> ScriptedLLM:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _completion(model: str, text: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def write_reflect_spec(folder: Path, upstreams: dict[str, Any], proposer: dict[str, Any], *, n_val: int,
                       n_test: int, agent_env: dict[str, str] | None = None, **extra: Any) -> Path:
    """The synthetic agent, right with p=0.2, or 0.95 when its prompt file says CAREFULLY."""
    shutil.copy(FIXTURES / "synthetic_agent.py", folder / "synthetic_agent.py")
    (folder / "prompts").mkdir(exist_ok=True)
    (folder / "prompts" / "base.md").write_text(BASE_PROMPT + "\n")
    tasks = [{"id": f"v{i:03d}", "split": "val"} for i in range(n_val)]
    tasks += [{"id": f"x{i:03d}", "split": "test"} for i in range(n_test)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    spec: dict[str, Any] = {
        "name": "reflect",
        "agent": {"command": "python synthetic_agent.py {task_file} {output_file}", "timeout_s": 30,
                  "env": {"SYNTH_P": "0.2", **(agent_env or {})}},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": {"entry": "synthetic_agent:grade"},
        "upstreams": upstreams,
        "knobs": {"prompt": {"files": ["prompts/base.md"], "via": "env", "name": "SYNTH_PROMPT_FILE"}},
        "proposer": proposer,
        "concurrency": 4,
        **extra,
    }
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _scripted_spec(folder: Path, llm: ScriptedLLM, *, rounds: int, markers: Path | None = None, **kw: Any) -> Path:
    env = {"SYNTH_CALL_MODEL": "1"}
    if markers is not None:
        env["SYNTH_MARKERS"] = str(markers)
    return write_reflect_spec(
        folder,
        # free: false, priced as the hosted API it stands in for (it lives on loopback, which counts as free).
        {"scripted": {"kind": "openai", "base_url": llm.base_url, "api_key_env": "SCRIPTED_KEY", "free": False}},
        {"model": "scripted/gpt-4.1-mini", "rounds": rounds, "minibatch": 8, "max_transcripts": 3,
         "max_tokens": 400},
        agent_env=env, model="scripted/agent-model", **kw,
    )


def _proposer_calls(study_dir: Path) -> list[tuple[str, float | None, int | None]]:
    with sqlite3.connect(study_dir / "store.sqlite") as conn:
        rows = conn.execute("SELECT rollout_id, cost_usd, status_code FROM calls WHERE rollout_id LIKE 'proposer-%' "
                            "ORDER BY seq").fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def test_reflect_keeps_the_good_proposal_rejects_the_bad_and_writes_the_winner(tmp_path: Path) -> None:
    good = "Reasoning: the agent guesses.\n<prompt>Read the task CAREFULLY, then answer.</prompt>"
    with ScriptedLLM(["<prompt>Answer fast.</prompt>", f"<prompt>{BASE_PROMPT}</prompt>", 400, good]) as llm:
        _scripted_spec(tmp_path, llm, rounds=4, n_val=20, n_test=12)
        result = run_agl(["optimize", "agl.yaml", "--strategy", "reflect", "--json", "-q"], cwd=tmp_path, env=KEY_ENV)
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
    assert doc["status"] == "completed" and doc["strategy"] == "reflect"
    proposals = {p["n"]: p for p in doc["reflect"]["proposals"]}
    assert sorted(proposals) == [1, 2, 3, 4] and all(p["parent"] == "baseline" for p in proposals.values())
    bad, same, failed, kept = proposals[1], proposals[2], proposals[3], proposals[4]
    assert not bad["accepted"] and bad["variant"] == "prompt=reflect-1" and bad["reason"]
    assert ("minibatch" in bad["reason"]) or bad["verdict"] != "better"
    assert same["reason"] == "identical to its parent" and same["file"] is None
    assert failed["reason"].startswith("the proposer call failed: BadRequestError") and failed["file"] is None
    assert kept["accepted"] and kept["verdict"] == "better" and kept["n_tasks"] == 20
    assert kept["difference"] > 0.5 and kept["ci95"][0] > 0 and kept["p_value"] < doc["reflect"]["alpha"] == 0.05 / 4
    assert kept["screen"]["passed"] and kept["screen"]["tasks"] == 8
    assert Path(kept["file"]).read_text() == "Read the task CAREFULLY, then answer.\n"
    assert Path(kept["file"]).parent == Path(doc["study_dir"]) / "proposals"
    assert doc["reflect"]["incumbent"] == "prompt=reflect-4"
    assert "prompt=reflect-4" in {m["name"] for m in doc["reflect"]["pareto_front"]}

    # The proposer saw the current prompt and transcripts of the baseline's failing rollouts, from the store.
    first = llm.proposer_requests[0]
    assert first["model"] == "gpt-4.1-mini" and first["max_completion_tokens"] == 400
    message = first["messages"][0]["content"]
    assert f"<current_prompt>\n{BASE_PROMPT}" in message and message.count("### Example") == 3
    store = sqlite3.connect(Path(doc["study_dir"]) / "store.sqlite")
    for rid in bad["shown"]:
        variant, task, reward = store.execute("SELECT variant, task_id, reward FROM rollouts WHERE id = ?",
                                              (rid,)).fetchone()
        assert variant == "baseline" and reward == 0.0 and task in bad["minibatch"]
        assert f"task {task}, reward 0" in message and f"[user] solve task {task}" in message
    assert "agent output: wrong" in message and f"[system] {BASE_PROMPT}" in message

    # Its calls are in the store under their own scope, priced, and counted in the study's spend.
    calls = _proposer_calls(Path(doc["study_dir"]))
    assert [c[0] for c in calls] == ["proposer-1", "proposer-2", "proposer-3", "proposer-4"]
    assert calls[2][2] == 400 and all(c[1] and c[1] > 0 for i, c in enumerate(calls) if i != 2)
    assert doc["reflect"]["proposer_cost_usd"] == pytest.approx(sum(c[1] or 0 for c in calls))
    # the agent's own model has no price: the study's total is unknown, its priced part holds the proposer's calls
    assert doc["spend"]["usd"] is None and doc["spend"]["unpriced_calls"] > 0
    assert doc["spend"]["priced_usd"] >= doc["reflect"]["proposer_cost_usd"] > 0

    # Then the usual flow: the kept proposal wins, is confirmed on test, and becomes agl.best.yaml.
    assert doc["winner"]["name"] == "prompt=reflect-4" and doc["confirmation"]["verdict"] == "better"
    best = yaml.safe_load((tmp_path / "agl.best.yaml").read_text())
    # The kept prompt is copied beside agl.best.yaml: the config outlives the study's folder.
    assert best["knobs"]["prompt"]["files"][:2] == ["agl.best/reflect-4.md", "prompts/base.md"]
    proposal = Path(doc["study_dir"]) / "proposals" / "reflect-4.md"
    assert (tmp_path / "agl.best" / "reflect-4.md").read_text() == proposal.read_text()
    # The study's report lists every proposal with its verdict against its parent.
    report_md = Path(doc["report"]["md"]).read_text()
    assert "Proposals by" in report_md and "reflect-4" in report_md and "accepted" in report_md
    rows = {r["name"]: r for r in doc["variants"]}
    assert rows["prompt=reflect-1"]["status"] == "dropped" and rows["prompt=reflect-4"]["status"] == "survived"


def test_reflect_without_a_proposer_says_what_to_add(tmp_path: Path) -> None:
    write_reflect_spec(tmp_path, {}, {"model": "x/y"}, n_val=4, n_test=2)
    spec = yaml.safe_load((tmp_path / "agl.yaml").read_text())
    del spec["proposer"], spec["upstreams"]
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump(spec))
    result = invoke_agl(["optimize", "agl.yaml", "--strategy", "reflect"], cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no `proposer:` section" in result.stderr and "proposer:\n    model: openai/gpt-4.1-mini" in result.stderr


def _marker_counts(markers: Path) -> Counter[tuple[str, str, str]]:
    starts: Counter[tuple[str, str, str]] = Counter()
    for marker in markers.iterdir():
        task, seed, _variant_hash, _pid = marker.name.split(".")
        starts[(marker.read_text(), task, seed)] += 1
    return starts


def test_interrupted_reflect_study_resumes_without_asking_or_running_anything_twice(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    good = "<prompt>Work CAREFULLY.</prompt>"
    with ScriptedLLM([good, "HOLD", "<prompt>Check the answer CAREFULLY twice.</prompt>"]) as llm:
        _scripted_spec(tmp_path, llm, rounds=2, markers=markers, n_val=16, n_test=8)
        proc = subprocess.Popen([sys.executable, "-m", "agl_cli", "optimize", "agl.yaml", "--strategy", "reflect",
                                 "-q", "--json"], cwd=tmp_path, env=agl_env(KEY_ENV), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert llm.holding.wait(120), "the study never asked for its second proposal"
            os.kill(proc.pid, signal.SIGINT)  # Ctrl-C while the proposer is thinking
            # The proposer answers only once the study has exited: however slowly the machine handles the signal,
            # the study cannot get that answer first (a sleep before releasing it raced the signal on a busy machine).
            _out, err = proc.communicate(timeout=60)
        finally:
            llm.release.set()
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, err
        (study_dir,) = (tmp_path / ".agl" / "runs").iterdir()
        assert len(llm.proposer_requests) == 2
        before = _marker_counts(markers)
        resumed = run_agl(["optimize", "--resume", study_dir.name, "--json", "-q"], cwd=tmp_path, env=KEY_ENV)
        assert resumed.returncode == 0, resumed.stderr
        doc = json.loads(resumed.stdout)
    assert doc["status"] == "completed" and [p["n"] for p in doc["reflect"]["proposals"]] == [1, 2]
    first, second = doc["reflect"]["proposals"]
    assert first["accepted"] and first["variant"] == "prompt=reflect-1"
    # Proposal 1 was made before the interrupt: replayed from the store, not asked again; only proposal 2 was.
    assert len(llm.proposer_requests) == 3
    assert "Check the answer CAREFULLY twice." in Path(second["file"]).read_text()
    assert [c[0] for c in _proposer_calls(study_dir)].count("proposer-1") == 1
    # No rollout ran twice, across the interrupt and the resume; the resume ran only what was missing.
    after = _marker_counts(markers)
    assert after and max(after.values()) == 1, [k for k, v in after.items() if v > 1]
    assert set(before) < set(after)
    assert ("prompt=reflect-1", "v000", "0") in before


def test_the_budget_stops_proposing_and_a_resume_with_more_continues_without_asking_again(tmp_path: Path) -> None:
    # Each scripted proposal writes 300 tokens, priced here at $1.6 per 1M output tokens and nothing for input: it
    # costs $0.00048 and reserves its worst case, max_tokens 400, $0.00064. The agent's own model is declared free of
    # charge (a budget needs every model it may pay for to have a price).
    script: list[str | int] = [f"<prompt>{BASE_PROMPT}</prompt>", "<prompt>Go CAREFULLY.</prompt>",
                               "<prompt>Go CAREFULLY and check.</prompt>"]
    with ScriptedLLM(script) as llm:
        _scripted_spec(tmp_path, llm, rounds=3, n_val=20, n_test=6,
                       prices={"scripted/agent-model": {"input": 0.0, "output": 0.0},
                               "scripted/gpt-4.1-mini": {"input": 0.0, "output": 1.6}})
        result = run_agl(["optimize", "agl.yaml", "--strategy", "reflect", "--budget-usd", "0.001", "--json", "-q"],
                         cwd=tmp_path, env=KEY_ENV)
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        # Proposal 1 fitted; proposal 2's worst case did not fit what was left, so it was never asked for: the
        # spend stays under the ceiling.
        assert doc["status"] == "budget_reached" and len(llm.proposer_requests) == 1
        (first,) = doc["reflect"]["proposals"]
        assert first["reason"] == "identical to its parent"
        assert "budget" in doc["reflect"]["stopped"] and 0 < doc["spend"]["usd"] <= 0.001
        resumed = run_agl(["optimize", "--resume", doc["study_id"], "--budget-usd", "1", "--json", "-q"],
                          cwd=tmp_path, env=KEY_ENV)
        assert resumed.returncode == 0, resumed.stderr
        again = json.loads(resumed.stdout)
    assert again["status"] == "completed" and len(llm.proposer_requests) == 3  # proposal 1 was not asked again
    proposals = again["reflect"]["proposals"]
    assert [p["n"] for p in proposals] == [1, 2, 3] and proposals[1]["accepted"]
    assert again["winner"]["name"].startswith("prompt=reflect-")


# -- the embedded model as the proposer ------------------------------------------------------------------------


@pytest.mark.usefixtures("smollm2")
@pytest.mark.slow
def test_reflect_with_the_embedded_model_as_proposer_records_its_proposal(tmp_path: Path) -> None:
    write_reflect_spec(
        tmp_path, {"local": {"kind": "embedded", "model": "smollm2-135m-instruct"}},
        {"model": "local/smollm2-135m-instruct", "rounds": 1, "minibatch": 0, "max_transcripts": 1,
         "max_tokens": 48, "temperature": 0.0},
        n_val=4, n_test=2,
    )
    result = run_agl(["optimize", "agl.yaml", "--strategy", "reflect", "--json", "-q"], cwd=tmp_path, timeout=900)
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: no winner is still a finished study
    doc = json.loads(result.stdout)
    assert doc["status"] == "completed"
    (proposal,) = doc["reflect"]["proposals"]
    assert proposal["status"] in ("accepted", "rejected") and (proposal["accepted"] or proposal["reason"])
    assert "proposal 1 (parent baseline)" in result.stderr
    calls = _proposer_calls(Path(doc["study_dir"]))
    assert [(c[0], c[2]) for c in calls] == [("proposer-1", 200)] and calls[0][1] == 0.0  # served here: free
