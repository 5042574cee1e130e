"""A small coding agent in the style of mini-swe-agent: the model writes one bash command per turn, the harness
runs it in the repository and shows the output, until the model runs `submit`. Built on the official OpenAI SDK.

Run it on one task (a line of tasks.jsonl saved as a file):

    python agent.py --task task.json --out fix.diff --workdir /tmp/work

It reads OPENAI_BASE_URL and OPENAI_API_KEY (under `agl`, the gateway sets them) and keeps its own model name
(AGENT_MODEL, default gpt-5-mini). The model works in `<workdir>/workspace`: a copy of the task's repository
without its .git history and without the hidden tests. Each command goes through policy.check_command first
(no edits to test or configuration files, no network or package installs, no paths outside the repository); a
refused command is answered with the reason and not run. Commands run with a clean environment (no API keys,
no agl paths, no pytest plugins) and a time limit. The output is the diff of the workspace against the copy it started from.
Settings: AGENT_MAX_STEPS (30), AGENT_COMMAND_TIMEOUT (60 s).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_repos import ensure_repo  # noqa: E402
from policy import check_command  # noqa: E402

MODEL = os.environ.get("AGENT_MODEL", "gpt-5-mini")
MAX_STEPS = int(os.environ.get("AGENT_MAX_STEPS", "30"))
COMMAND_TIMEOUT = float(os.environ.get("AGENT_COMMAND_TIMEOUT", "60"))
OUTPUT_LIMIT = 6000
CACHES = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache")

SYSTEM = """You are a software engineer fixing a bug in a small Python repository.

Each reply: a short THOUGHT, then exactly one bash code block with one command (which may be a heredoc):

```bash
python -m pytest -q
```

The command runs in a fresh shell in the repository root; you see its exit code and output. Inspect the code,
reproduce the bug, fix the source, and check your fix. Rules: do not change tests or test configuration (tests/,
conftest.py, pytest.ini, setup.cfg, pyproject.toml, tox.ini); no network access or package installs; stay inside
the repository (relative paths only). When the fix is done, reply with the command `submit` alone."""

BASH_BLOCK = re.compile(r"```(?:bash|sh)?\s*\n(.*?)```", re.S)


def make_workspace(repo: Path, workdir: Path, hidden: list[str]) -> tuple[Path, Path]:
    """Two copies of the repository without .git and hidden tests: `base` (kept) and `workspace` (the agent's)."""
    skip = {".git", *CACHES}

    def ignore(folder: str, names: list[str]) -> set[str]:
        rel = Path(folder).relative_to(repo)
        return {n for n in names if n in skip or (rel / n).as_posix() in hidden}

    base, workspace = workdir / "base", workdir / "workspace"
    for target in (base, workspace):
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(repo, target, ignore=ignore)
    return base, workspace


def run_command(command: str, workspace: Path) -> str:
    """Run one command in the workspace with a clean environment; its exit code and (truncated) output."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workspace), "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "TERM": "dumb", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           # git must not find a repository above the workspace (a run folder inside a checkout would leak history)
           "GIT_CEILING_DIRECTORIES": str(workspace.parent)}
    try:
        done = subprocess.run(["bash", "-c", command], cwd=workspace, env=env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, output = "timeout", f"the command ran past {COMMAND_TIMEOUT:g} s and was stopped\n{exc.stdout or ''}"
    if len(output) > OUTPUT_LIMIT:
        output = output[: OUTPUT_LIMIT // 2] + "\n[... output shortened ...]\n" + output[-OUTPUT_LIMIT // 2 :]
    return f"<returncode>{code}</returncode>\n<output>\n{output}</output>"


def workspace_diff(base: Path, workspace: Path) -> str:
    """`git diff` of the workspace against its starting copy, with paths relative to the repository root."""
    for cache in CACHES:
        for folder in workspace.rglob(cache):
            shutil.rmtree(folder, ignore_errors=True)
    done = subprocess.run(
        ["git", "diff", "--no-index", "--binary", "--no-color", "--no-renames", "--", base.name, workspace.name],
        cwd=base.parent, capture_output=True, text=True,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"git diff failed: {done.stderr}")
    prefix_a, prefix_b = f"a/{base.name}/", f"b/{workspace.name}/"
    lines = []
    for line in done.stdout.splitlines(keepends=True):
        if line.startswith(("diff --git ", "--- ", "+++ ")):
            line = line.replace(prefix_a, "a/").replace(prefix_b, "b/")
        lines.append(line)
    return "".join(lines)


def solve(task: dict, workdir: Path) -> str:
    """Run the agent loop on one task; return the diff it made."""
    base, workspace = make_workspace(ensure_repo(task["repo"]), workdir, task.get("hidden_tests", []))
    client = OpenAI(max_retries=2)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Fix this issue in the repository:\n\n{task['issue']}"}]
    for _ in range(MAX_STEPS):
        response = client.chat.completions.create(model=MODEL, messages=messages)
        reply = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        blocks = BASH_BLOCK.findall(reply)
        if len(blocks) != 1:
            observation = f"Reply with exactly one bash code block (found {len(blocks)})."
        elif blocks[0].strip() == "submit":
            break
        elif reason := check_command(blocks[0]):
            observation = f"<refused>The harness did not run this command: {reason}.</refused>"
        else:
            observation = run_command(blocks[0], workspace)
        messages.append({"role": "user", "content": observation})
    return workspace_diff(base, workspace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="a JSON file holding one task of tasks.jsonl")
    parser.add_argument("--out", required=True, help="where to write the diff")
    parser.add_argument("--workdir", help="where to make the workspace (default: a temporary folder)")
    args = parser.parse_args()
    task = json.loads(Path(args.task).read_text())
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="coding-agent-"))
    Path(args.out).write_text(solve(task, workdir))


if __name__ == "__main__":
    main()
