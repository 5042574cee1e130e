"""In a cluster no grader can read the controller's credentials: a real grader (an `entry:` function, and a
`command:`) tries the environment it gets and agl's process's /proc/PID/environ, where the pod put the gateway's
admin token and the policy servers' key; it finds neither. agl runs without capabilities, as in the trainer's pod (the
grader under the same uid: the hard case); the ServiceAccount token is not mounted where graders run on their own
(the rollout pods), which the manifest tests cover.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_DUMPABLE are Linux's"),
    pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None,
                       reason="as root, dropping the capabilities needs setpriv (util-linux)"),
]
ADMIN_TOKEN = "agl-admin-token-a-grader-must-not-see-1f2e3d"
POLICY_KEY = "agl-policy-key-a-grader-must-not-see-4c5b6a"

SNOOP = textwrap.dedent('''
    import json, os, sys

    def snoop():
        """What of agl's credentials this grader can get at."""
        seen = [k for k in ("AGL_GATEWAY_ADMIN_TOKEN", "AGL_POLICY_API_KEY") if os.environ.get(k)]
        try:
            with open(f"/proc/{os.environ['SNOOP_AGL_PID']}/environ", "rb") as handle:
                environ = handle.read()
            for name, value in (("proc:admin", "@ADMIN@"), ("proc:policy", "@POLICY@")):
                if value.encode() in environ:
                    seen.append(name)
        except OSError as exc:
            seen.append(f"refused:{type(exc).__name__}")
        return seen

    def grade(task, output):
        return {"score": 1.0, "seen": snoop()}

    if __name__ == "__main__":
        print(json.dumps(grade(None, None)))
''').replace("@ADMIN@", ADMIN_TOKEN).replace("@POLICY@", POLICY_KEY)

# The trainer's side: agl in the pod, its credentials in its environment from the start (as the kubelet gives them).
SCENARIO = textwrap.dedent('''
    import asyncio, json, os, sys
    from pathlib import Path
    from agl_cli.evaluation.runner import AGL_CREDENTIALS
    from agl_cli.evaluation.grading import Grader
    from agl_cli.spec.schema import load_spec

    folder = Path(sys.argv[1])
    spec = load_spec(folder / "agl.yaml")
    env = {k: v for k, v in os.environ.items() if k not in AGL_CREDENTIALS}  # what agl gives graders
    env["SNOOP_AGL_PID"] = str(os.getpid())
    (folder / "task.json").write_text("{}")
    (folder / "output.txt").write_text("42")
    grade = asyncio.run(Grader(spec, None, env).grade("r1", {}, folder / "task.json", folder / "output.txt"))
    print(json.dumps({"reward": grade.reward, "detail": grade.detail, "error": grade.error}))
''')


def _without_capabilities() -> list[str]:
    """Root (with CAP_SYS_PTRACE) reads every process's /proc files: run agl without any capability, as the pod does
    (a non-root uid, `drop: [ALL]`). Then the grader has agl's uid and nothing more: the case that matters."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]


@pytest.mark.parametrize("form", ["entry", "command"])
def test_a_grader_in_a_cluster_cannot_read_agls_credentials(form: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        _check(Path(folder), form)


def _check(tmp_path: Path, form: str) -> None:
    (tmp_path / "snoop.py").write_text(SNOOP)
    grader = {"entry": "snoop:grade"} if form == "entry" else {"command": "{python} snoop.py"}
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({
        "name": "iso", "agent": {"command": "true"}, "tasks": {"path": "tasks.jsonl"}, "grader": grader}))
    (tmp_path / "tasks.jsonl").write_text('{"id": "t"}\n')
    (tmp_path / "scenario.py").write_text(SCENARIO)
    env = {**os.environ, "AGL_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN, "AGL_POLICY_API_KEY": POLICY_KEY,
           "KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOME": str(tmp_path)}
    done = subprocess.run([*_without_capabilities(), sys.executable, str(tmp_path / "scenario.py"), str(tmp_path)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["reward"] == 1.0, result
    assert result["detail"]["seen"] == ["refused:PermissionError"], result  # it tried, and Linux said no


# --- the trainer's pod on a cluster: graders in a container of their own -------------------------------------------

CONTROLLER_UID, GRADER_UID = 10001, 10002  # the images' user; the grader container's (_trainer_pod.yaml.j2)

SNOOP_CONTAINER = textwrap.dedent('''
    import json, os, sys

    def snoop():
        """Every way a grader could get at the controller's credentials from its container."""
        seen = [k for k, v in os.environ.items() if v in ("@ADMIN@", "@POLICY@") or k in (
            "AGL_GATEWAY_ADMIN_TOKEN", "AGL_POLICY_API_KEY", "SNOOP_AGL_PID")]
        pid = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "controller.pid")).read().strip()
        for what in (f"/proc/{pid}/environ", os.path.join(os.path.dirname(os.path.abspath(__file__)), "sa-token")):
            try:
                with open(what, "rb") as handle:
                    handle.read()
                seen.append(f"read:{what}")
            except OSError:
                pass
        return {"uid": os.getuid(), "seen": seen}

    def grade(task, output):
        return {"score": float(output.strip() == "42"), **snoop(), "task": task}

    if __name__ == "__main__":
        print(json.dumps(grade(json.load(open(sys.argv[1])), open(sys.argv[2]).read())))
''').replace("@ADMIN@", ADMIN_TOKEN).replace("@POLICY@", POLICY_KEY)

CONTROLLER = textwrap.dedent('''
    import asyncio, json, os, sys
    from pathlib import Path
    from agl_cli.evaluation.grading import Grader
    from agl_cli.spec.schema import load_spec

    folder, work = Path(sys.argv[1]), Path(sys.argv[2])
    (folder / "controller.pid").write_text(str(os.getpid()))
    spec = load_spec(folder / "agl.yaml")
    (work / "task.json").write_text('{"id": "t", "question": "6*7"}')
    (work / "output.txt").write_text("42")
    grade = asyncio.run(Grader(spec, None, dict(os.environ)).grade("r1", {}, work / "task.json", work / "output.txt"))
    print(json.dumps({"reward": grade.reward, "detail": grade.detail, "error": grade.error}))
''')


def _as(uid: int, *groups: int) -> list[str]:
    """A process of `uid` with no capabilities, as a container's non-root user runs (pod fsGroup: `groups`)."""
    listed = ["--groups=" + ",".join(map(str, groups))] if groups else ["--clear-groups"]
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", *listed, "--bounding-set=-all", "--inh-caps=-all",
            "--no-new-privs", "--"]


def _python_for_others() -> tuple[str, dict[str, str]]:
    """A python another uid may run with agl's packages: the test's own may sit under a home only root can enter
    (pyenv in /root); then the system's python of the same version, given this checkout and the venv's packages."""
    import site
    import sysconfig

    if all(os.stat(p).st_mode & 0o005 for p in Path(sys.executable).resolve().parents):
        return sys.executable, {}
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    system = shutil.which(version, path="/usr/bin:/usr/local/bin") or ""
    packages = [str(Path(__file__).resolve().parents[1]), sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    return system, {"PYTHONPATH": os.pathsep.join(dict.fromkeys(packages))}


@pytest.mark.skipif(os.geteuid() != 0, reason="two uids (controller, grader container) need root to set up")
@pytest.mark.skipif(not _python_for_others()[0], reason="no python that a second uid may run")
@pytest.mark.parametrize("form", ["entry", "command"])
def test_a_grader_container_reads_no_credential_and_still_scores(form: str) -> None:
    with tempfile.TemporaryDirectory() as top:
        root = Path(top)
        project, shared, work = root / "project", root / "grader", root / "work"
        for folder, mode, owner in ((project, 0o755, 0), (shared, 0o777, 0), (work, 0o700, CONTROLLER_UID)):
            folder.mkdir()
            os.chmod(folder, mode)
            os.chown(folder, owner, owner)
        os.chmod(root, 0o755)
        (project / "snoop.py").write_text(SNOOP_CONTAINER)
        grader = {"entry": "snoop:grade"} if form == "entry" else {"command": "{python} snoop.py {task_file} "
                                                                               "{output_file}"}
        (project / "agl.yaml").write_text(yaml.safe_dump({
            "name": "iso", "agent": {"command": "true"}, "tasks": {"path": "tasks.jsonl"}, "grader": grader}))
        (project / "tasks.jsonl").write_text('{"id": "t"}\n')
        (project / "controller.py").write_text(CONTROLLER)
        # The ServiceAccount token: the controller's container has it, the grader container does not.
        token = project / "sa-token"
        token.write_text("eyJhbGciOi-a-service-account-token")
        os.chown(token, CONTROLLER_UID, CONTROLLER_UID)
        os.chmod(token, 0o600)
        (project / "controller.pid").write_text("1")
        os.chown(project / "controller.pid", CONTROLLER_UID, CONTROLLER_UID)
        # The grader container: its own uid, the pod's fsGroup, an environment with no credential in it.
        server_env = {"PATH": os.environ["PATH"], "HOME": "/tmp", "PYTHONUNBUFFERED": "1", **_python_for_others()[1]}
        server = subprocess.Popen([*_as(GRADER_UID, CONTROLLER_UID), _python_for_others()[0], "-m",
                                   "agl_cli.evaluation.grade_server", str(shared), "--project", str(project)],
                                  env=server_env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            env = {**os.environ, "AGL_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN, "AGL_POLICY_API_KEY": POLICY_KEY,
                   "KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOME": str(work), "AGL_GRADER_DIR": str(shared)}
            done = subprocess.run([*_as(CONTROLLER_UID, CONTROLLER_UID), sys.executable, str(project / "controller.py"),
                                   str(project), str(work)], env=env, cwd=project, capture_output=True, text=True,
                                  timeout=40)
        except subprocess.TimeoutExpired:
            server.terminate()
            pytest.fail(f"no grade within 40 s; the grader container said: {server.communicate(timeout=10)[1]}")
        finally:
            server.terminate()
            _, server_log = server.communicate(timeout=10)
        assert done.returncode == 0, done.stderr + server_log
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["reward"] == 1.0, (result, server_log)
        detail = result["detail"]
        assert detail["uid"] == GRADER_UID  # it ran in the grader container, not as the controller
        assert detail["seen"] == [], detail  # it tried the environment, the controller's /proc and the token
        assert detail["task"] == {"id": "t", "question": "6*7"}  # the task file came through
        assert server.returncode == 0, server_log  # SIGTERM (the pod ending) stops it cleanly
        assert not list((shared / "requests").iterdir()) and not (shared / "work").exists() or \
            not list((shared / "work").iterdir())


def test_the_controller_says_so_when_no_grader_container_answers(tmp_path: Path) -> None:
    import asyncio

    from agl_cli.evaluation.grade_channel import GraderChannel
    from agl_cli.evaluation.grading import Grader
    from agl_cli.spec.schema import load_spec
    from rl_backend.store.records import FailureKind

    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({
        "name": "iso", "agent": {"command": "true"}, "tasks": {"path": "tasks.jsonl"},
        "grader": {"command": "{python} grade.py", "timeout_s": 1}}))
    (tmp_path / "tasks.jsonl").write_text('{"id": "t"}\n')
    (tmp_path / "task.json").write_text("{}")
    (tmp_path / "output.txt").write_text("42")
    shared = tmp_path / "grader"
    shared.mkdir()
    grader = Grader(load_spec(tmp_path / "agl.yaml"), None, {}, isolate=False)  # type: ignore[arg-type]
    grader.channel = GraderChannel(shared, pickup_s=0.3, grace_s=0.3)
    grade = asyncio.run(grader.grade("r1", {}, tmp_path / "task.json", tmp_path / "output.txt"))
    assert grade.reward is None and grade.failure == FailureKind.grader_crashed
    assert grade.error is not None and "no grader container answered within 0.3 s" in grade.error
    assert "-c grader" in grade.error  # where to look
    assert not list((shared / "requests").iterdir())  # the request is withdrawn
    # Taken but never answered: the grader's timeout plus the grace, then it says the container went quiet.
    (shared / "answers").mkdir()

    async def take_and_hang() -> Any:
        task = asyncio.create_task(grader.grade("r2", {}, tmp_path / "task.json", tmp_path / "output.txt"))
        while not any(p.name.endswith(".json") and ".task" not in p.name for p in (shared / "requests").iterdir()):
            await asyncio.sleep(0.01)
        request = next(p for p in (shared / "requests").iterdir() if p.name.endswith(".output"))
        (shared / "answers" / request.name.replace(".output", ".taken")).write_text("")
        return await task

    late = asyncio.run(take_and_hang())
    assert late.error is not None and "took the request but gave no answer within 1.3 s" in late.error


def test_a_grader_that_runs_in_the_grader_container_is_not_looked_for_in_the_trainers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The grader container runs the rollouts' image: a tool only that image has (node, a test runner) is not on the
    # trainer's PATH, and the trainer's preflight must not refuse the train for it. Locally it still does.
    from agl_cli.errors import ConfigError
    from agl_cli.evaluation.preflight import check_commands
    from agl_cli.spec.schema import load_spec

    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({
        "name": "iso", "agent": {"command": "true"}, "tasks": {"path": "tasks.jsonl"}, "runner": "kubernetes",
        "kubernetes": {"image": "agent:1", "gateway_url": "http://10.0.0.1:8090"},
        "grader": {"command": "agl-only-in-the-agent-image {task_file} {output_file}"}}))
    (tmp_path / "tasks.jsonl").write_text('{"id": "t"}\n')
    spec = load_spec(tmp_path / "agl.yaml")
    monkeypatch.delenv("AGL_GRADER_DIR", raising=False)
    with pytest.raises(ConfigError, match="agl-only-in-the-agent-image"):
        check_commands(spec)
    monkeypatch.setenv("AGL_GRADER_DIR", str(tmp_path))
    check_commands(spec)


def test_a_grader_that_swaps_the_request_folder_for_a_link_redirects_no_write(tmp_path: Path) -> None:
    # The shared emptyDir is writable by both containers: a grader can rename `requests` away and put a link to a
    # folder of the controller's in its place. The controller writes through the folder it made, never the link.
    import asyncio

    from agl_cli.evaluation.grade_channel import GraderChannel

    shared, elsewhere = tmp_path / "grader", tmp_path / "controllers-own-folder"
    shared.mkdir()
    elsewhere.mkdir()
    (tmp_path / "task.json").write_text("{}")
    (tmp_path / "output.txt").write_text("42")
    channel = GraderChannel(shared, pickup_s=0.3)
    (shared / "requests").rename(shared / "moved")
    (shared / "requests").symlink_to(elsewhere)

    async def send() -> tuple[list[str], list[str]]:
        task = asyncio.create_task(channel.run("{python} grade.py", rollout_id="r1", task_file=tmp_path / "task.json",
                                               output_file=tmp_path / "output.txt", timeout_s=1))
        await asyncio.sleep(0.15)  # the request is out, waiting to be taken
        seen = sorted(p.name for p in elsewhere.iterdir()), sorted(p.name for p in (shared / "moved").iterdir())
        with pytest.raises(TimeoutError, match="no grader container answered"):
            await task
        return seen

    redirected, kept = asyncio.run(send())
    assert redirected == [] and len(kept) == 3 and all(n.startswith("r1-") for n in kept)
    assert list((shared / "moved").iterdir()) == []  # withdrawn after the timeout
    # A link in place of the folder from the start is refused, not followed.
    (shared / "requests").unlink()
    (shared / "requests").symlink_to(elsewhere)
    from agl_cli.evaluation.grade_channel import GraderChannelError

    with pytest.raises(GraderChannelError, match="not a directory"):
        GraderChannel(shared)
