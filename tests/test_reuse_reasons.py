"""Reuse that explains itself: every planned rollout that was not reused from an earlier run says why, on stderr and in
`--json` (the earlier one failed; the agent changed: which file, which key of agl.yaml; the variant changed: which
knob), and adding a knob whose first option is `null` (or a prompt file) keeps the cached baseline. Real `agl eval`
runs of the synthetic agent in a git repository; rollout ids are unique across those runs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from rl_backend.store.db import RunStore
from tests.helpers import FIXTURES, run_agl, write_tasks


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=folder, check=True,
                   capture_output=True)


def _write(folder: Path, **changes: Any) -> None:
    spec: dict[str, Any] = {
        "name": "reuse",
        "agent": {"command": "python synthetic_agent.py {task_file} {output_file}", "env": {"SYNTH_P": "0.5"}},
        "tasks": {"path": "tasks.jsonl"},
        "grader": {"entry": "synthetic_agent:grade"},
        "concurrency": 3,
        **changes,
    }
    (folder / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def _eval(folder: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_agl(["eval", "agl.yaml", "--json", "--no-report", "-q"], cwd=folder, env=env)
    doc: dict[str, Any] = json.loads(result.stdout)
    doc["_stderr"] = result.stderr
    return doc


def _reasons(doc: dict[str, Any]) -> list[tuple[str, int]]:
    return [(entry["reason"], entry["rollouts"]) for entry in doc["reuse"]["not_reused"]]


def test_every_rollout_not_reused_says_why(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "synthetic_agent.py", tmp_path / "synthetic_agent.py")
    write_tasks(tmp_path / "tasks.jsonl", [{"id": f"t{i}"} for i in range(3)])
    _write(tmp_path)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "agent")

    # An outside cause (a variable agl.yaml does not set) makes every rollout crash.
    crashed = _eval(tmp_path, env={"SYNTH_P_FILE": str(tmp_path / "missing")})
    assert crashed["variants"][0]["missing"] == 3 and _reasons(crashed) == [("no_earlier", 3)]
    assert "not reused" not in crashed["_stderr"]  # nothing earlier to reuse: nothing to explain

    first = _eval(tmp_path)
    assert _reasons(first) == [("earlier_failed", 3)] and first["variants"][0]["not_reused"] == {"earlier_failed": 3}
    reason = first["reuse"]["not_reused"][0]
    assert reason["since_run"] == crashed["run_id"] and "(agent_crashed)" in reason["detail"]
    assert f"not reused: 3 rollouts: the earlier rollout failed (agent_crashed) in run {crashed['run_id']}" \
        in first["_stderr"]

    # A knob added with `null` first, and a new prompt file it offers: the baseline is what it was, and reused.
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "v2.md").write_text("Think twice.")
    knobs = {"extra": {"values": [None, "x"], "via": "env", "name": "SYNTH_EXTRA"},
             "prompt": {"files": [None, "prompts/v2.md"], "via": "file", "path": "{rollout_dir}/prompt.md"}}
    _write(tmp_path, knobs=knobs)
    kept = _eval(tmp_path)
    assert kept["reuse"]["reused"] == 3 and kept["reuse"]["not_reused"] == [], kept["_stderr"]
    assert kept["spend"]["rollouts_launched"] == 0

    # The agent's code changed: the file is named.
    with (tmp_path / "synthetic_agent.py").open("a") as agent:
        agent.write("# tuned\n")
    edited = _eval(tmp_path)
    assert _reasons(edited) == [("agent_changed", 3)]
    assert f"not reused: 3 rollouts: the agent changed since run {kept['run_id']}: synthetic_agent.py" \
        in edited["_stderr"]

    # A key of agl.yaml that changes the agent: the key is named.
    _write(tmp_path, knobs=knobs, agent={"command": "python synthetic_agent.py {task_file} {output_file}",
                                         "env": {"SYNTH_P": "0.6"}})
    retuned = _eval(tmp_path)
    assert _reasons(retuned) == [("agent_changed", 3)]
    assert "agl.yaml `agent.env.SYNTH_P`" in retuned["reuse"]["not_reused"][0]["detail"]

    # The baseline now sets the knob it used to leave alone: the variant changed, and the knob is named.
    knobs["extra"]["values"] = ["y", "x"]
    _write(tmp_path, knobs=knobs, agent={"command": "python synthetic_agent.py {task_file} {output_file}",
                                         "env": {"SYNTH_P": "0.6"}})
    moved = _eval(tmp_path)
    assert _reasons(moved) == [("variant_changed", 3)]
    assert f"variant baseline changed since run {retuned['run_id']}: extra unset -> y" in moved["_stderr"]

    # Each of these runs ran the same variant, task and seed: every rollout still has an id of its own.
    ids: list[str] = []
    for doc in (crashed, first, edited, retuned, moved):
        store = RunStore(Path(doc["run_dir"]) / "store.sqlite", read_only=True)
        ids += [r.id for r in store.rollouts()]
        store.close()
    assert len(ids) == 15 and len(set(ids)) == 15


def test_rollout_ids_differ_between_runs_of_the_same_plan(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "synthetic_agent.py", tmp_path / "synthetic_agent.py")
    write_tasks(tmp_path / "tasks.jsonl", [{"id": "t0"}, {"id": "t1"}])
    _write(tmp_path)
    runs = [json.loads(run_agl(["eval", "agl.yaml", "--json", "--no-report", "-q", "--no-cache"], cwd=tmp_path,
                               check=True).stdout) for _ in range(2)]
    ids = []
    for doc in runs:
        store = RunStore(Path(doc["run_dir"]) / "store.sqlite", read_only=True)
        ids.append({r.id for r in store.rollouts()})
        store.close()
    assert len(ids[0]) == len(ids[1]) == 2 and not ids[0] & ids[1]
    # Each id names its own transcript.
    shown = run_agl(["transcript", runs[1]["run_id"], sorted(ids[1])[0]], cwd=tmp_path, check=True)
    assert sorted(ids[1])[0] in shown.stdout
