"""Grade one coding task by its hidden tests: 1.0 when every fail-to-pass and pass-to-pass test passes, else 0.0.

    python grade.py TASK_FILE OUTPUT_FILE     # OUTPUT_FILE: the agent's diff; prints {"score": ..., ...}

The agent's workspace is never tested. The grader clones the original repository (its committed state, hidden
tests included) into a fresh folder, applies only the parts of the agent's diff that touch non-test source files
(policy.is_protected decides; changes to tests, conftest.py, pytest.ini, setup.cfg, pyproject.toml or tox.ini are
dropped and listed under `ignored`), and runs the task's fail-to-pass and pass-to-pass tests there.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_repos import ensure_repo  # noqa: E402
from policy import is_protected  # noqa: E402

FILE_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


def split_diff(diff: str) -> list[tuple[str, str]]:
    """[(path, the diff's section for that file)] for a git-style diff."""
    sections: list[tuple[str, list[str]]] = []
    for line in diff.splitlines(keepends=True):
        header = FILE_HEADER.match(line.rstrip("\n"))
        if header:
            sections.append((header.group(2) if header.group(2) != "/dev/null" else header.group(1), [line]))
        elif sections:
            sections[-1][1].append(line)
    return [(path, "".join(lines)) for path, lines in sections]


def test_results(junit: Path) -> dict[str, bool]:
    """'tests/test_x.py::name' -> passed, from pytest's JUnit XML."""
    results: dict[str, bool] = {}
    if not junit.is_file():
        return results
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        failed = any(child.tag in ("failure", "error", "skipped") for child in case)
        results[f"{path}::{case.get('name')}"] = not failed
    return results


def passed(test_id: str, results: dict[str, bool]) -> bool:
    """A test id, or a whole file: passed when it ran and nothing in it failed."""
    if "::" in test_id:
        return results.get(test_id, False)
    mine = [ok for tid, ok in results.items() if tid.startswith(test_id + "::")]
    return bool(mine) and all(mine)


def grade(task: dict, diff: str) -> dict:
    original = ensure_repo(task["repo"])
    sections = split_diff(diff)
    ignored = sorted({path for path, _ in sections if is_protected(path)})
    applied = [(path, text) for path, text in sections if not is_protected(path)]
    detail: dict = {"applied": sorted({p for p, _ in applied}), "ignored": ignored}
    with tempfile.TemporaryDirectory(prefix="coding-grade-") as tmp:
        fresh = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(original), str(fresh)], check=True,
                       capture_output=True)
        if applied:
            patch = Path(tmp) / "agent.patch"
            patch.write_text("".join(text for _, text in applied))
            done = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=fresh, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                return {"score": 0.0, **detail, "error": f"the diff does not apply: {done.stderr.strip()[:500]}"}
        tests = task["fail_to_pass"] + task["pass_to_pass"]
        junit = Path(tmp) / "junit.xml"
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                               *tests], cwd=fresh, env=env, capture_output=True, text=True, timeout=300)
        if not junit.is_file():  # pytest itself failed: the grader cannot tell, which is not a score of 0
            raise RuntimeError(f"pytest did not run (exit {done.returncode}): {(done.stdout + done.stderr)[-800:]}")
        results = test_results(junit)
    f2p = {t: passed(t, results) for t in task["fail_to_pass"]}
    p2p = {t: passed(t, results) for t in task["pass_to_pass"]}
    score = 1.0 if all(f2p.values()) and all(p2p.values()) else 0.0
    return {"score": score, "fail_to_pass": f2p, "pass_to_pass": p2p, **detail}


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python grade.py TASK_FILE OUTPUT_FILE")
    task = json.loads(Path(sys.argv[1]).read_text())
    output = Path(sys.argv[2])
    print(json.dumps(grade(task, output.read_text() if output.exists() else "")))


if __name__ == "__main__":
    main()
