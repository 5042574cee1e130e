"""What a run keeps of its rollouts under hostile conditions: a grader's unusable score fails that rollout and the
run finishes; only scored rollouts are reused; configured keys never reach what agl writes; a huge output file is
never read whole; and a command that cannot start is refused before the first rollout."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from agl_cli.main import app
from rl_backend.httpserver import ServerThread
from rl_backend.store.db import RunStore
from rl_backend.store.records import FailureKind, RolloutStatus
from tests.helpers import FIXTURES, agl_env, run_agl, write_spec

AGENT = f"python {FIXTURES / 'hostile_agent.py'} {{task_file}} {{output_file}}"
GRADER = f"python {FIXTURES / 'hostile_grader.py'} {{task_file}} {{output_file}}"


def _eval(folder: Path, *args: str) -> tuple[dict, subprocess.CompletedProcess[str]]:
    result = run_agl(["eval", "agl.yaml", "--json", *args], cwd=folder)
    assert result.stdout.strip(), result.stderr
    return json.loads(result.stdout), result


def _by_task(doc: dict) -> dict:
    store = RunStore(Path(doc["run_dir"]) / "store.sqlite")
    try:
        return {r.task_id: r for r in store.rollouts(latest_only=True)}
    finally:
        store.close()


def test_unusable_scores_fail_their_rollout_and_the_run_finishes(tmp_path: Path) -> None:
    (tmp_path / "mygrader.py").write_text(
        "def huge(task, output):\n    return 10 ** 400\n"
        "def infinite(task, output):\n    return {'score': float('inf')}\n"
        "def unstorable(task, output):\n    return {'score': 1, 'seen': object()}\n"
    )
    tasks = [{"id": "ok", "answer": "1"}, {"id": "huge", "grader": "huge_int"}, {"id": "inf", "grader": "inf"},
             {"id": "range", "grader": "out_of_range"}, {"id": "deep", "grader": "deep"}]
    write_spec(tmp_path, tasks, agent={"command": AGENT}, grader={"command": GRADER})
    doc, result = _eval(tmp_path)
    assert result.returncode == 0, result.stderr
    assert doc["status"] == "completed" and doc["report"].get("html")
    assert "Traceback" not in result.stderr
    rollouts = _by_task(doc)
    assert rollouts["ok"].reward == 1.0
    for task_id in ("huge", "inf", "range", "deep"):
        rollout = rollouts[task_id]
        assert rollout.status is RolloutStatus.failed and rollout.failure is FailureKind.grader_garbage, task_id
        assert rollout.reward is None
    assert "1000000000" in rollouts["huge"].error and "(401 characters)" in rollouts["huge"].error
    assert "not a finite number" in rollouts["inf"].error
    assert "2500000" in rollouts["range"].error and "outside the accepted range" in rollouts["range"].error
    assert "nested more than 64 levels" in rollouts["deep"].error
    again = run_agl(["eval", "--resume", doc["run_id"], "--json"], cwd=tmp_path)  # nothing left, no crash
    assert again.returncode == 0, again.stderr

    write_spec(tmp_path, [{"id": "a"}, {"id": "b"}], agent={"command": AGENT},
               grader={"command": None, "entry": "mygrader:huge"})
    doc, result = _eval(tmp_path, "--no-report")
    assert result.returncode == 1 and doc["variants"][0]["missing_reasons"] == {"grader_garbage": 2}, result.stderr
    for entry in ("infinite", "unstorable"):
        spec_text = (tmp_path / "agl.yaml").read_text()
        (tmp_path / "agl.yaml").write_text(spec_text.replace("mygrader:huge", f"mygrader:{entry}")
                                           .replace("mygrader:infinite", f"mygrader:{entry}"))
        doc, result = _eval(tmp_path, "--no-report")
        assert doc["variants"][0]["missing_reasons"] == {"grader_garbage": 2}, result.stderr


def test_scores_outside_0_to_1_and_a_score_given_twice_are_grader_errors(tmp_path: Path) -> None:
    tasks = [{"id": g, "grader": g} for g in ("negative", "above_one", "underflow", "twice")]
    write_spec(tmp_path, [{"id": "ok", "answer": "1"}, *tasks], agent={"command": AGENT}, grader={"command": GRADER})
    doc, result = _eval(tmp_path, "--no-report")
    assert result.returncode == 0, result.stderr
    rollouts = _by_task(doc)
    for task_id in ("negative", "above_one", "twice"):
        assert rollouts[task_id].failure is FailureKind.grader_garbage and rollouts[task_id].reward is None, task_id
    assert "the score is -0.5, outside the accepted range 0 to 1" in rollouts["negative"].error
    assert "the score is 1.5, outside the accepted range 0 to 1" in rollouts["above_one"].error
    assert "gives `score` more than once" in rollouts["twice"].error
    # 1e-400 is positive but below the smallest float: a 0, said so in the grader's detail.
    assert rollouts["underflow"].reward == 0.0
    assert rollouts["underflow"].grader_detail == {"agl_note": "the score 1e-400 is below the smallest float: counted as 0"}
    variant = doc["variants"][0]
    assert variant["n"] == 2 and variant["missing_reasons"] == {"grader_garbage": 3}
    assert variant["accuracy"]["mean"] == 0.5  # (1 + 0) / 2: never a negative or >100% accuracy


def test_task_ids_with_control_characters_are_escaped_on_the_terminal_and_exact_in_json(tmp_path: Path) -> None:
    ids = ["\x1b[31mred\x1b[0m", "nul\x00here", "rtl\u202eevil", "two\nlines"]
    write_spec(tmp_path, [{"id": i, "answer": "1"} for i in ids], agent={"command": AGENT}, grader={"command": GRADER})
    result = run_agl(["eval", "agl.yaml", "--no-report"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown = ["\\x1b[31mred\\x1b[0m", "nul\\x00here", "rtl\\u202eevil", "two\\nlines"]
    run_id = result.stderr.split("run ", 1)[1].split(":", 1)[0]
    table = run_agl(["runs", run_id], cwd=tmp_path, check=True).stdout
    transcript = run_agl(["transcript", run_id], cwd=tmp_path, check=True).stdout
    for text in (result.stderr, table, transcript):  # progress lines, the run's table, transcript headers
        assert "\x1b" not in text and "\x00" not in text and "\u202e" not in text, text
        assert all(s in text for s in shown), text
    doc = json.loads(run_agl(["runs", run_id, "--json"], cwd=tmp_path, check=True).stdout)
    assert sorted(r["task_id"] for r in doc["rollouts"]) == sorted(ids)  # JSON keeps them exact


def _crashing_eval(folder: Path) -> tuple[Path, Path]:
    markers, flag = folder / "markers", folder / "upstream-down"
    markers.mkdir(parents=True)
    flag.write_text("")
    tasks = [{"id": f"t{i}", "behavior": "crash_if_flag", "flag": str(flag), "answer": "1"} for i in range(3)]
    write_spec(folder, tasks, agent={"command": AGENT, "env": {"HOSTILE_MARKERS": str(markers)}},
               grader={"command": GRADER})
    down, _ = _eval(folder, "--no-report")  # the agent crashes: its upstream is unreachable
    assert down["variants"][0]["missing_reasons"] == {"agent_crashed": 3}
    assert len(list(markers.iterdir())) == 3
    return markers, flag


def test_failed_rollouts_run_again_and_scored_ones_are_reused(tmp_path: Path) -> None:
    markers, flag = _crashing_eval(tmp_path)
    flag.unlink()  # the upstream is back
    fixed, result = _eval(tmp_path, "--no-report")
    assert "reused 3" not in result.stderr and fixed["reuse"]["reused"] == 0
    assert [r["reason"] for r in fixed["reuse"]["not_reused"]] == ["earlier_failed"]  # and says so
    assert len(list(markers.iterdir())) == 6  # every failure ran again
    assert fixed["variants"][0]["n"] == 3 and fixed["variants"][0]["accuracy"]["mean"] == 1.0
    again, result = _eval(tmp_path, "--no-report")
    assert "reused 3" in result.stderr and len(list(markers.iterdir())) == 6  # scored: nothing ran again
    assert again["variants"][0]["n"] == 3


def test_reuse_failures_reuses_the_agents_own_failures(tmp_path: Path) -> None:
    markers, _ = _crashing_eval(tmp_path)
    kept, result = _eval(tmp_path, "--no-report", "--reuse-failures")
    assert "reused 3" in result.stderr and len(list(markers.iterdir())) == 3
    assert kept["variants"][0]["missing_reasons"] == {"agent_crashed": 3}


@pytest.fixture
def echo_upstream() -> Iterator[str]:
    """An OpenAI-compatible upstream that echoes the API key it was sent: the worst an upstream can do with it."""

    async def chat(request: Request) -> JSONResponse:
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        return JSONResponse({
            "id": "c1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"your key is {key}!"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
        })

    server = ServerThread(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])).start()
    yield server.base_url + "/v1"
    server.stop()


def test_configured_keys_never_reach_what_agl_writes(tmp_path: Path, echo_upstream: str) -> None:
    key = "zq7-Wobble-0c9e1f4a2b7d66"  # no known key format: only its value can identify it
    write_spec(tmp_path, [{"id": "a", "grader": "echo"}], agent={"command": AGENT, "env": {}},
               tasks={"path": "tasks.jsonl"}, grader={"command": GRADER},
               upstreams={"echo": {"kind": "openai-compatible", "base_url": echo_upstream, "api_key_env": "ECHO_KEY",
                                   "free": True}}, model="echo/m")
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "a", "behavior": "echo_call", "grader": "echo"}) + "\n")
    result = run_agl(["eval", "agl.yaml", "--json"], cwd=tmp_path, env={"ECHO_KEY": key})
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    run = Path(doc["run_dir"])
    (rollout,) = RunStore(run / "store.sqlite").rollouts()
    assert "your key is [redacted]!" in (rollout.output or "")
    assert "[redacted]" in (rollout.stdout_tail or "") and "[redacted]" in (rollout.stderr_tail or "")
    assert rollout.grader_detail is not None and "[redacted]" in rollout.grader_detail["echo"]
    written = [run / "store.sqlite", *run.rglob("*.txt"), *run.rglob("*.md"), *run.rglob("*.html"),
               *run.rglob("*.json")]
    wal = run / "store.sqlite-wal"
    for path in [*written, *([wal] if wal.exists() else [])]:
        assert key.encode() not in path.read_bytes(), f"the key reached {path}"
    assert key not in result.stdout and key not in result.stderr


# Runs a command and prints the peak memory of it and its descendants. A process started straight from pytest would
# report pytest's own resident memory too: a forked child starts with its parent's pages, and the peak survives exec.
PEAK_OF = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True)
sys.stdout.buffer.write(done.stdout)
sys.stderr.buffer.write(done.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(done.returncode)
"""


def test_a_huge_output_file_is_never_read_whole(tmp_path: Path) -> None:
    write_spec(tmp_path, [{"id": "big", "behavior": "sparse_output", "mb": 300, "grader": "blind"}],
               agent={"command": AGENT}, grader={"command": GRADER})
    done = subprocess.run([sys.executable, "-c", PEAK_OF, sys.executable, "-m", "agl_cli", "eval", "agl.yaml",
                           "--json", "--no-report"], cwd=tmp_path, env=agl_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    peak_mb = int(done.stderr.strip().splitlines()[-1]) / 1024  # kilobytes on Linux: agl and what it waited for
    assert peak_mb < 200, f"agl peaked at {peak_mb:.0f} MB for a 300 MB output file"
    rollout = _by_task(json.loads(out))["big"]
    assert rollout.reward == 1.0 and len(rollout.output or "") == 64 * 1024


@pytest.mark.parametrize(("section", "command", "expected"), [
    ("grader", "./grade.sh {task_file} {output_file}", "./grade.sh is not executable: make it so (chmod +x"),
    ("agent", "no-such-agent-xyz --task {task_file}", "'no-such-agent-xyz' is not a command on PATH"),
    ("agent", "python missing_agent.py {task_file} {output_file}", "python is given missing_agent.py, which does not exist"),
    ("grader", "./nowhere/grade {task_file}", "./nowhere/grade does not exist"),
])
def test_a_command_that_cannot_start_is_refused_before_the_first_rollout(
    tmp_path: Path, section: str, command: str, expected: str,
) -> None:
    (tmp_path / "grade.sh").write_text("#!/bin/sh\necho 1\n")  # not executable
    write_spec(tmp_path, [{"id": "a"}], **{section: {"command": command}})
    runs = tmp_path / "runs"
    started = time.monotonic()
    spec = str(tmp_path / "agl.yaml")
    for args in (["eval", spec], ["optimize", spec, "-v", "baseline"], ["train", spec]):
        result = CliRunner().invoke(app, [*args, "--runs-dir", str(runs)])
        text = " ".join(result.output.split())
        assert result.exit_code == 2, (args, result.output)
        assert "agl.yaml:" in text and f"`{section}.command`: {expected}" in text, text
    assert not runs.exists()  # nothing was created, nothing ran
    assert time.monotonic() - started < 20
