"""What a cluster train's rollouts run, and what they may see: the agent's code from its image or from the shipped
project (checked: a dry run refuses what the pods would miss), the grader's code always shipped, images pinned by
digest when given so, and agl's own credentials never in an agent's environment."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from rl_backend.provision.options import ProvisionError
from rl_backend.provision.session import dry_run
from tests.helpers import run_agl
from tests.test_provision_isolation import cluster_spec, rollout_job
from tests.test_provision_render import _app
from tests.test_provision_support import AGL_YAML, fast_schemas, load_target, options, write_project  # noqa: F401

pytestmark = pytest.mark.timeout(60)
DIGEST = "sha256:" + "ab" * 32


def write_bundled(folder: Path, **overrides: Any) -> Path:
    """A project without an agent image (no `kubernetes:` section): its agent runs from the shipped files."""
    path = write_project(folder, **overrides)
    data = yaml.safe_load(path.read_text())
    data.pop("kubernetes", None)
    data.pop("runner", None)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    (folder / "agent.py").write_text("import json, sys\nfrom helpers import answer\nprint(answer())\n")
    (folder / "helpers.py").write_text("def answer():\n    return 42\n")
    return path


def _config_paths(manifests: list[dict[str, Any]]) -> set[str]:
    """The files the ConfigMap ships, by their path in the pods."""
    return {item["path"] for item in cluster_spec(manifests).model_dump()["project"]["items"]}


def test_without_an_agent_image_the_rollouts_run_the_shipped_agent(tmp_path: Path) -> None:
    config = write_bundled(tmp_path)
    result = dry_run(load_target(config), options(include=["helpers.py"]))
    assert _config_paths(result.manifests) == {"agl.yaml", "tasks.jsonl", "prompts/a.md", "agent.py", "helpers.py",
                                               "grade.py"}
    spec = cluster_spec(result.manifests)
    assert spec.image.startswith("ghcr.io/agl-dev/agl-runtime:") and spec.workdir == "/etc/agl/project"
    pod = rollout_job(result.manifests, tmp_path)["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    assert agent["workingDir"] == "/etc/agl/project" and agent["image"] == spec.image
    assert {"name": "project", "mountPath": "/etc/agl/project", "readOnly": True} in agent["volumeMounts"]
    volume = next(v for v in pod["volumes"] if v["name"] == "project")["configMap"]
    assert volume["name"] == "agl-calc-config" and {"key": "f3-agent.py", "path": "agent.py"} in volume["items"]
    assert any("from the shipped project" in note for note in result.notes)


def test_with_an_agent_image_the_rollouts_run_it_and_the_grader_is_shipped(tmp_path: Path) -> None:
    result = dry_run(load_target(write_project(tmp_path)), options())
    spec = cluster_spec(result.manifests)
    assert spec.image == AGL_YAML["kubernetes"]["image"] and spec.workdir is None  # the image's own WORKDIR
    assert "grade.py" in _config_paths(result.manifests)  # the grader runs in the trainer's pod
    assert "agent.py" not in _config_paths(result.manifests)
    # The project is there too (read-only), for knob files the agent reads by path.
    mounts = rollout_job(result.manifests, tmp_path)["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "project", "mountPath": "/etc/agl/project", "readOnly": True} in mounts
    other = dry_run(load_target(write_project(tmp_path)), options(agent_image=f"registry.example/other@{DIGEST}"))
    assert cluster_spec(other.manifests).image == f"registry.example/other@{DIGEST}"


@pytest.mark.parametrize(("case", "message", "hint"), [
    ("no agent file", "agent.command needs 'agent.py'", "--agent-image"),
    ("unshipped import", "imports helpers.py", "--include helpers.py"),
    ("no grader file", "grader.command needs 'grade.py'", "the grader runs in the trainer's pod"),
])
def test_a_dry_run_refuses_what_the_rollouts_would_miss(tmp_path: Path, case: str, message: str, hint: str) -> None:
    if case == "no grader file":
        config = write_project(tmp_path)
        (tmp_path / "grade.py").unlink()
    else:
        config = write_bundled(tmp_path)
        if case == "no agent file":
            (tmp_path / "agent.py").unlink()
    result = CliRunner().invoke(_app(), [str(config), "--on", "kubernetes", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert message in result.output and hint in result.output
    assert result.stdout == ""  # nothing rendered, nothing printed as if it were a plan


def test_an_entry_agent_ships_its_package(tmp_path: Path) -> None:
    config = write_bundled(tmp_path, agent={"entry": "calcagent.main:run", "timeout_s": 60})
    (tmp_path / "calcagent").mkdir()
    (tmp_path / "calcagent" / "__init__.py").write_text("")
    (tmp_path / "calcagent" / "main.py").write_text("def run(task):\n    return '42'\n")
    paths = _config_paths(dry_run(load_target(config), options()).manifests)
    assert {"calcagent/__init__.py", "calcagent/main.py"} <= paths
    with pytest.raises(ProvisionError, match="agent.entry needs 'nowhere/main.py'"):
        dry_run(load_target(write_bundled(tmp_path, agent={"entry": "nowhere.main:run", "timeout_s": 60})), options())


def test_images_pinned_by_digest_are_kept_and_malformed_ones_refused(tmp_path: Path) -> None:
    pinned = f"registry.example/agl-trainer@{DIGEST}"
    result = dry_run(load_target(write_project(tmp_path)),
                     options(image=pinned, gateway_image=f"registry.example/agl-runtime:0.1.0@{DIGEST}",
                             agent_image=f"registry.example/agent@{DIGEST}"))
    job = next(m for m in result.manifests if m["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == pinned
    assert not any("pin each by digest" in note for note in result.notes)
    tagged = dry_run(load_target(write_project(tmp_path)), options()).notes
    assert any("registry.example/calc-agent:1" in note and "pin each by digest" in note for note in tagged)
    bad = CliRunner().invoke(_app(), [str(write_project(tmp_path)), "--on", "kubernetes", "--dry-run",
                                      "--image", "Registry/Bad Image:1"])
    assert bad.exit_code == 2 and "--image 'Registry/Bad Image:1' is not an image reference" in bad.output


AGENT = """
import json, os, sys
seen = {name: os.environ.get(name) for name in ("AGL_GATEWAY_ADMIN_TOKEN", "AGL_POLICY_API_KEY", "KEEP_ME")}
open(sys.argv[2], "w").write(json.dumps(seen))
"""
GRADER = """
import json, os, sys
seen = json.load(open(sys.argv[2]))
clean = not os.environ.get("AGL_GATEWAY_ADMIN_TOKEN") and not os.environ.get("AGL_POLICY_API_KEY")
print(1.0 if clean and seen == {"AGL_GATEWAY_ADMIN_TOKEN": None, "AGL_POLICY_API_KEY": None, "KEEP_ME": "yes"} else 0.0)
"""


def test_local_agents_and_graders_never_see_agls_credentials(tmp_path: Path) -> None:
    # What a trainer's pod holds in its environment: no agent or grader process started from there gets it.
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "grade.py").write_text(GRADER)
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "t1"}) + "\n")
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({
        "name": "env-check", "agent": {"command": f"{sys.executable} agent.py {{task_file}} {{output_file}}",
                                       "timeout_s": 30},
        "tasks": {"path": "tasks.jsonl"}, "grader": {"command": f"{sys.executable} grade.py {{task_file}} "
                                                                "{output_file}"}}))
    result = run_agl(["eval", "agl.yaml", "--json"], tmp_path, timeout=120, env={
        "AGL_GATEWAY_ADMIN_TOKEN": "admin-0123456789abcdef", "AGL_POLICY_API_KEY": "policy-0123456789abcdef",
        "KEEP_ME": "yes"})
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    rollouts = list((tmp_path / ".agl").rglob("output.txt"))
    assert [json.loads(p.read_text()) for p in rollouts] == [
        {"AGL_GATEWAY_ADMIN_TOKEN": None, "AGL_POLICY_API_KEY": None, "KEEP_ME": "yes"}]
    assert summary["variants"][0]["accuracy"]["mean"] == 1.0  # the grader saw neither either


def test_what_a_command_names_is_told_apart_from_programs_and_arguments(tmp_path: Path) -> None:
    from rl_backend.provision.bundle import Program, command_files

    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "agent.py").write_text("")
    (tmp_path / "data.jsonl").write_text("")
    command = (f"/usr/bin/env {sys.executable} agent.py --data=data.jsonl --model gpt-4o-mini --t 0.7 "
               "--url http://x/y.json tools/run.sh {task_file} && sh -c 'python other.py'")
    assert command_files(Program("agent", command), tmp_path, "fix") == ["agent.py", "data.jsonl", "tools/run.sh"]
    with pytest.raises(ProvisionError, match="needs 'missing.py'"):
        command_files(Program("agent", "python missing.py"), tmp_path, "fix")
    outside = tmp_path.parent / "elsewhere.py"
    outside.write_text("")
    with pytest.raises(ProvisionError, match="outside the folder of agl.yaml"):
        command_files(Program("grader", f"python {outside}"), tmp_path, "fix")
