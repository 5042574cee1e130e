"""The agent-lightning skill: valid by the Agent Skills reference validator, found exactly once by gh's discovery
rules, within the spec's limits, and mentioning only `agl` commands and flags that exist."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import typer
import yaml

from agl_cli.main import app

# Not imported from tests.conftest: a top-level `tests` package in site-packages (verl ships one) shadows it.
REPO = Path(__file__).resolve().parent.parent

SKILL = REPO / "skills" / "agent-lightning"
# Files whose text may name agl invocations: the skill itself, and advise's hints, which the skill relays.
TEXT_FILES = [*sorted(SKILL.rglob("*.md")), *sorted((SKILL / "scripts").glob("*.py")), SKILL / "agents" / "openai.yaml",
              REPO / "agl_cli" / "training" / "advise.py"]


def _frontmatter(text: str) -> tuple[dict[str, object], str]:
    assert text.startswith("---\n")
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


def test_skill_validates_with_the_reference_validator() -> None:
    validator = pytest.importorskip("skills_ref.validator")
    assert validator.validate(SKILL) == []


def test_frontmatter_and_body_follow_the_spec() -> None:
    meta, body = _frontmatter((SKILL / "SKILL.md").read_text())
    assert set(meta) == {"name", "description", "license"}
    assert meta["name"] == SKILL.name == "agent-lightning"
    description = str(meta["description"])
    assert len(description) <= 1024
    assert "<" not in description and ">" not in description
    assert description.startswith("Use when"), "the trigger comes first"
    assert "Do not use" in description
    assert len(body.splitlines()) < 500


def test_references_are_one_level_deep_and_each_says_when_to_read_it() -> None:
    skill_text = (SKILL / "SKILL.md").read_text()
    references = sorted((SKILL / "references").glob("*"))
    assert references
    for path in references:
        assert path.is_file() and path.suffix == ".md", path
        line = next((ln for ln in skill_text.splitlines() if ln.startswith(f"- `references/{path.name}`")), None)
        assert line is not None, f"SKILL.md never points at {path.name}"
        assert "read when" in line.lower(), f"SKILL.md does not say when to read {path.name}"
        text = path.read_text()
        assert "Read this when" in text.split("\n\n")[1], f"{path.name} opens without saying when to read it"
        others = [p.name for p in references if p != path and p.name in text]
        assert not others, f"{path.name} points at {others}: references stay one level deep"
    for mentioned in re.findall(r"`((?:references|scripts)/[\w-]+\.\w+)`", skill_text):
        assert (SKILL / mentioned).is_file(), f"SKILL.md names {mentioned}, which does not exist"


# -- gh's discovery rules (cli/cli internal/skills/discovery: matchSkillConventions, matchHiddenDirConventions) --

_SAFE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._\- ]*$")


def _valid(name: str) -> bool:
    return 0 < len(name) <= 64 and "/" not in name and ".." not in name and bool(_SAFE_NAME.match(name))


def gh_match(path: str) -> tuple[str, str] | None:
    """(skill name, convention) when gh would install `path` as a skill's SKILL.md, else None."""
    p = PurePosixPath(path)
    if p.name != "SKILL.md":
        return None
    folder = p.parent
    name, parent, grandparent = folder.name, folder.parent, folder.parent.parent
    if not _valid(name):
        return None  # also a SKILL.md at the repository root: its folder name is empty
    if str(parent) == "skills":
        return name, "skills"
    if str(grandparent) == "skills":
        return (name, "skills-namespaced") if _valid(parent.name) else None
    if parent.name == "skills" and str(grandparent.parent) == "plugins":
        return (name, "plugins") if _valid(grandparent.name) else None
    if str(parent) == "." and name not in ("skills", "plugins") and not name.startswith("."):
        return name, "root"
    if parent.name == "skills" and str(grandparent.parent) == "." and grandparent.name.startswith("."):
        return name, "hidden-dir"
    if grandparent.name == "skills" and str(grandparent.parent.parent) == "." and grandparent.parent.name.startswith("."):
        return name, "hidden-dir-namespaced"
    return None


def test_gh_discovery_rules_themselves() -> None:
    assert gh_match("skills/foo/SKILL.md") == ("foo", "skills")
    assert gh_match("SKILL.md") is None
    assert gh_match("foo/SKILL.md") == ("foo", "root")
    assert gh_match("skills/team/foo/SKILL.md") == ("foo", "skills-namespaced")
    assert gh_match("plugins/p/skills/foo/SKILL.md") == ("foo", "plugins")
    assert gh_match(".claude/skills/foo/SKILL.md") == ("foo", "hidden-dir")
    assert gh_match("docs/guide/SKILL.md") is None
    assert gh_match("skills/foo/references/x.md") is None


def test_gh_finds_exactly_one_skill_named_as_its_folder() -> None:
    # Tracked files plus the untracked ones git would commit: what gh will see once this tree is pushed.
    listing = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, text=True, check=False)
    if listing.returncode != 0:
        pytest.skip("not a git checkout")
    files = [f for f in listing.stdout.splitlines() if (REPO / f).exists()]
    found = {path: m for path in files if (m := gh_match(path))}
    assert found == {"skills/agent-lightning/SKILL.md": ("agent-lightning", "skills")}
    assert "SKILL.md" not in files, "a root SKILL.md is never found by gh; the skill lives in skills/<name>/"
    meta, _ = _frontmatter((REPO / "skills/agent-lightning/SKILL.md").read_text())
    assert meta["name"] == "agent-lightning"


# -- every `agl ...` the skill mentions exists --------------------------------------------------------------


def _code_snippets(path: Path) -> list[str]:
    text = path.read_text()
    snippets: list[str] = []
    if path.suffix == ".py":
        module = ast.parse(text)
        doc = ast.get_docstring(module) or ""
        snippets += [line.strip() for line in doc.splitlines() if line.strip().startswith("agl ")]
    if path.suffix == ".md":
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
            snippets += block.replace("\\\n", " ").splitlines()
        text = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    snippets += re.findall(r"`([^`\n]+)`", text)
    return snippets


def invocations(snippet: str) -> list[list[str]]:
    """The argument lists of every `agl` invocation in a shell snippet (quotes respected, stopping at | ; > &&)."""
    lexer = shlex.shlex(snippet, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        tokens = snippet.split()
    found: list[list[str]] = []
    current: list[str] | None = None
    for token in tokens:
        if token == "agl" and current is None:
            current = []
        elif current is not None and set(token) <= set("|;&><()"):
            found.append(current)
            current = None
        elif current is not None:
            current.append(token)
    if current is not None:
        found.append(current)
    return [args for args in found if args]


def check_invocation(root: Any, args: list[str]) -> str | None:
    """None when `agl ARGS` names real sub-commands and options; else what is wrong. Duck-typed: typer vendors
    its own click, so a group is whatever has `commands`."""
    command = root
    words = list(args)
    path = ["agl"]
    while hasattr(command, "commands") and words and not words[0].startswith("-"):
        if words[0] not in command.commands and hasattr(command, "default_command_for"):
            words.insert(0, command.default_command_for(words))  # `agl train CONFIG ...` routes to a hidden command
        name = words.pop(0)
        sub = command.commands.get(name)
        if sub is None:
            return f"`{' '.join(path)} {name}`: no such command"
        command, path = sub, [*path, name]
    if hasattr(command, "commands"):
        return None  # a group named alone (e.g. `agl skill`)
    options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}
    for word in words:
        if word.startswith("--") and word.split("=", 1)[0] not in options:
            return f"`{' '.join(path)}` has no option {word.split('=', 1)[0]}"
    return None


def test_every_agl_command_and_flag_the_skill_mentions_exists() -> None:
    root = typer.main.get_command(app)
    assert hasattr(root, "commands")
    problems, seen = [], 0
    for path in TEXT_FILES:
        for snippet in _code_snippets(path):
            for args in invocations(snippet):
                seen += 1
                problem = check_invocation(root, args)
                if problem:
                    problems.append(f"{path.relative_to(REPO)}: {snippet!r}: {problem}")
    assert seen > 20, "the parser found too few invocations to be trusted"
    assert not problems, "\n".join(problems)


def test_the_checker_catches_what_does_not_exist() -> None:
    root = typer.main.get_command(app)
    assert hasattr(root, "commands")
    assert check_invocation(root, ["eval", "agl.yaml", "--split", "val"]) is None
    assert check_invocation(root, ["skill", "install", "--agent", "codex"]) is None
    assert "no such command" in (check_invocation(root, ["frobnicate"]) or "")
    assert "no option --nope" in (check_invocation(root, ["compare", "a", "b", "--nope"]) or "")
    assert invocations('agl init --agent "python a.py --task {task_file}" --grader g') == [
        ["init", "--agent", "python a.py --task {task_file}", "--grader", "g"]]
    assert invocations("agl eval x --json | failures.py --eval-json -") == [["eval", "x", "--json"]]
