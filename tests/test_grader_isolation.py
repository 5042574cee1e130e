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
