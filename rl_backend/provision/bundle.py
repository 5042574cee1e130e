"""What a cluster train's rollouts need, and where each part comes from.

In the cluster every rollout is a Job (the trainer's pod runs no agent: it holds the token of the train's
ServiceAccount and the gateway's admin token). The agent's code comes from one of two places:

- an agent image (`kubernetes.image` in agl.yaml, or `--agent-image`): the command runs at the image's WORKDIR (or
  `kubernetes.workdir`), as `agl eval` with `runner: kubernetes` runs it; its files are the image's, not checked here;
- otherwise the project itself: the files the agent command names (and an `entry:` module) travel in the train's
  ConfigMap, and rollout pods run the gateway's runtime image (Python with agl and the OpenAI and Anthropic SDKs)
  in that folder.

The grader always runs in the trainer's pod, on the shipped project. So the files a command names (relative paths,
`--flag=path` values) are added to the bundle, and the Python files shipped are read for imports of modules that sit
next to them: one that exists here but is not shipped is refused before anything is applied (`--include` ships it).
"""

from __future__ import annotations

import ast
import importlib.util
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rl_backend.provision.options import ProvisionError

# Tokens with these endings name files: a missing one is an error, not an argument that happens to look like a word.
SCRIPT_SUFFIXES = {".py", ".sh", ".js", ".mjs", ".cjs", ".ts", ".rb", ".pl", ".jsonl", ".json", ".yaml", ".yml",
                   ".md", ".txt", ".toml", ".cfg", ".ini"}
PLACEHOLDER = "__agl_placeholder__"


@dataclass(frozen=True)
class Program:
    """One part of the spec that runs code: the agent or the grader, as a shell command or a module entry."""

    what: str  # "agent" | "grader"
    command: str | None = None
    entry: str | None = None


@dataclass
class RolloutSource:
    """Where rollout pods get the agent: `image` (the agent's own) or `bundle` (the shipped project)."""

    kind: Literal["image", "bundle"]
    image: str
    files: list[str] = field(default_factory=list)  # relative paths the bundle must hold (agent and grader code)
    notes: list[str] = field(default_factory=list)


def _missing(program: Program, raw: str, base: Path, remedy: str) -> ProvisionError:
    key = "command" if program.command else "entry"
    return ProvisionError(
        f"{program.what}.{key} needs {raw!r}, which is not in the folder of agl.yaml ({base}): in the cluster, "
        f"the {program.what} gets that folder's files only", hint=remedy, exit_code=2)


def _inside(base: Path, path: Path) -> str | None:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return None


def command_files(program: Program, base: Path, remedy: str) -> list[str]:
    """The files and folders (relative to `base`) that a command line names."""
    assert program.command is not None
    text = program.command
    for name in ("task_file", "output_file", "rollout_dir", "rollout_id", "python"):
        text = text.replace("{" + name + "}", PLACEHOLDER)
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ProvisionError(f"{program.what}.command cannot be split into words: {exc}", exit_code=2) from None
    found: list[str] = []
    for token in tokens:
        value = token.split("=", 1)[1] if token.startswith("-") and "=" in token else token
        if (not value or value.startswith("-") or PLACEHOLDER in value or "://" in value
                or any(ch.isspace() for ch in value)):  # a flag, a URL, or a shell snippet (`sh -c "..."`)
            continue
        path = Path(value) if Path(value).is_absolute() else base / value
        relative = _inside(base, path)
        if relative is None and path.suffix not in SCRIPT_SUFFIXES:
            continue  # a program of the image's (/usr/bin/env, an interpreter's path), not the project's
        if path.exists():
            if relative is None:
                raise ProvisionError(
                    f"{program.what}.command names {value}, which is outside the folder of agl.yaml ({base})",
                    hint="move it next to agl.yaml (the cluster gets that folder's files only)", exit_code=2)
            found.append(relative)
        elif not Path(value).is_absolute() and Path(value).suffix in SCRIPT_SUFFIXES:
            raise _missing(program, value, base, remedy)
    return found


def entry_files(program: Program, base: Path, remedy: str) -> tuple[list[str], list[str]]:
    """The module of an `entry:` (its top-level package folder, or its file), and notes."""
    assert program.entry is not None
    module = program.entry.split(":", 1)[0]
    top = module.split(".")[0]
    package, single = base / top, base / (module.replace(".", "/") + ".py")
    if (package / "__init__.py").is_file():
        return [top], []
    if "." not in module and single.is_file():
        return [single.name], []
    if importlib.util.find_spec(top) is not None:
        return [], [f"{program.what}.entry {program.entry!r}: module {top!r} is not in the folder of agl.yaml; it is "
                    "taken to be installed in the image that runs it"]
    raise _missing(program, module.replace(".", "/") + ".py", base, remedy)


def local_imports(base: Path, shipped: list[str]) -> list[str]:
    """Modules next to a shipped Python file (or at the project's root) that it imports but the bundle lacks."""
    have = set(shipped)
    lacking: list[str] = []
    for relative in shipped:
        path = base / relative
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.suffix == ".py" else []
        for file in files:
            try:
                tree = ast.parse(file.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, OSError):
                continue
            names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module]
            for name in names:
                top = name.split(".")[0]
                for folder in dict.fromkeys((file.parent, base)):
                    for candidate in (folder / f"{top}.py", folder / top):
                        rel = _inside(base, candidate)
                        if rel is None or not candidate.exists() or (candidate.is_dir() and not (
                                candidate / "__init__.py").is_file()):
                            continue
                        if not any(rel == h or rel.startswith(h.rstrip("/") + "/") for h in have):
                            lacking.append(rel)
    return list(dict.fromkeys(lacking))


def rollout_source(base: Path, agent: Program, grader: Program, *, agent_image: str | None,
                   runtime_image: str) -> RolloutSource:
    """Decide where rollout pods get the agent and which files the bundle must carry; refuse what cannot work."""
    source = RolloutSource("image", agent_image) if agent_image else RolloutSource("bundle", runtime_image)
    remedy = "put it next to agl.yaml, or build the agent into an image and give it (kubernetes.image in agl.yaml, " \
             "or --agent-image)"
    programs = [grader] if source.kind == "image" else [agent, grader]
    if source.kind == "image":
        source.notes.append(f"rollouts run the agent from image {agent_image} (its files are the image's: agl does "
                            "not check them)")
    else:
        source.notes.append(f"rollouts run the agent from the shipped project in image {runtime_image} (no agent "
                            "image given: kubernetes.image in agl.yaml, or --agent-image)")
    for program in programs:
        fix = remedy if program.what == "agent" else "put it next to agl.yaml: the grader runs in the trainer's pod"
        if program.command:
            source.files += command_files(program, base, fix)
        elif program.entry:
            files, notes = entry_files(program, base, fix)
            source.files += files
            source.notes += notes
    source.files = list(dict.fromkeys(source.files))
    return source


def check_imports(base: Path, shipped: list[str]) -> None:
    lacking = local_imports(base, shipped)
    if lacking:
        raise ProvisionError(
            "the shipped code imports " + ", ".join(lacking) + ", which sits next to it but is not shipped: "
            "the pods that run it would fail with ModuleNotFoundError",
            hint=" ".join(f"--include {path}" for path in lacking), exit_code=2)
