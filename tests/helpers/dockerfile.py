"""Read a Dockerfile without Docker: its instructions, the files its build stage copies, the package installs of its
RUN lines and the checks that follow them, so that a test can build a virtualenv from exactly what an image installs.

Only the subset of Dockerfile syntax our images use is understood (FROM/ARG/COPY/RUN/USER/ENV/WORKDIR, `\\`
continuations, `#` comments); anything in an install line the parser does not know raises, so a Dockerfile that
changes shape fails the image tests instead of being half-read.
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# Options of `pip install` / `uv pip install` that change where or how, never what, gets installed.
_HARMLESS = {"--no-cache-dir", "--no-cache", "--system", "-q", "--quiet", "--upgrade", "-U"}
_SEPARATORS = {"&&", "||", ";", "|", "(", ")", "then", "else", "fi", "if", "do", "done"}


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: RUN, COPY, ...
    args: str
    stage: int  # index of the FROM it belongs to


@dataclass(frozen=True)
class PipInstall:
    """One `pip install` of a RUN line: its requirement arguments and whether dependencies are resolved."""

    requirements: tuple[str, ...]
    no_deps: bool


@dataclass
class Image:
    path: Path
    instructions: list[Instruction] = field(default_factory=list)

    @property
    def final_stage(self) -> int:
        return max(i.stage for i in self.instructions)

    def of(self, keyword: str, stage: int | None = None) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword and (stage is None or i.stage == stage)]

    def user(self) -> str:
        """The USER the final stage runs as (the last USER instruction of that stage)."""
        users = self.of("USER", self.final_stage)
        if not users:
            raise ValueError(f"{self.path}: the final stage sets no USER (it would run as root)")
        return users[-1].args.strip()

    def env(self) -> dict[str, str]:
        """The final stage's ENV (KEY=VALUE form, as our Dockerfiles write it)."""
        found: dict[str, str] = {}
        for inst in self.of("ENV", self.final_stage):
            for item in shlex.split(inst.args):
                key, _, value = item.partition("=")
                found[key] = value
        return found

    def pip_installs(self) -> list[PipInstall]:
        """Every distinct `pip install` of every RUN line (an `if uv ... else pip ... fi` installing the same set
        twice counts once)."""
        installs: list[PipInstall] = []
        for inst in self.of("RUN"):
            for found in _pip_installs(inst.args):
                if found not in installs:
                    installs.append(found)
        return installs

    def install_stage(self) -> int:
        stages = {i.stage for i in self.of("RUN") if _pip_installs(i.args)}
        if len(stages) != 1:
            raise ValueError(f"{self.path}: expected the installs in one stage, found them in {sorted(stages)}")
        return stages.pop()

    def checks(self) -> list[list[str]]:
        """The commands a RUN line runs after installing to prove the image works (`agl ...`, `python ...`)."""
        found: list[list[str]] = []
        for inst in self.of("RUN"):
            for command in _commands(inst.args):
                if command and command[0] in {"agl", "python"}:
                    found.append([word for word in command if not word.startswith((">", "2>"))])
        return found

    def stage_context(self, repo: Path, dest: Path) -> Path:
        """Copy what the install stage's COPY lines copy from the build context (`repo`) into `dest`, laid out as
        in the image; returns the directory the install runs in (its WORKDIR), where `.` points."""
        stage = self.install_stage()
        workdir = PurePosixPath("/")
        for inst in [i for i in self.instructions if i.stage == stage]:
            if inst.keyword == "WORKDIR":
                workdir = workdir / inst.args.strip()
            elif inst.keyword == "COPY" and "--from" not in inst.args:
                *sources, target = [w for w in shlex.split(inst.args) if not w.startswith("--")]
                into = workdir / target
                for source in sources:
                    origin = repo / source
                    if not origin.exists():
                        raise FileNotFoundError(f"{self.path}: COPY {source}: not in the build context {repo}")
                    where = dest / str(into).lstrip("/")
                    if target.endswith("/") or len(sources) > 1:
                        where = where / origin.name
                    where.parent.mkdir(parents=True, exist_ok=True)
                    if origin.is_dir():
                        shutil.copytree(origin, where, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                    else:
                        shutil.copy2(origin, where)
            # The installs come after the copies; later instructions do not change what was installed.
            if inst.keyword == "RUN" and _pip_installs(inst.args):
                break
        return dest / str(workdir).lstrip("/")


def parse(path: Path) -> Image:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    image = Image(path)
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stage = -1
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        image.instructions.append(Instruction(keyword, args.strip(), max(stage, 0)))
    return image


def _commands(script: str) -> list[list[str]]:
    """A RUN line's simple commands: shell words split at `&&`, `||`, `;`, pipes and if/then/else/fi."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word in _SEPARATORS or set(word) <= set(";&|()"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


def _pip_installs(script: str) -> list[PipInstall]:
    found: list[PipInstall] = []
    for command in _commands(script):
        words = list(command)
        for i in range(len(words) - 1):
            if words[i].endswith("pip") and words[i + 1] == "install":
                rest = words[i + 2:]
                break
        else:
            continue
        no_deps = "--no-deps" in rest
        unknown = [w for w in rest if w.startswith("-") and w not in _HARMLESS | {"--no-deps"}]
        if unknown:
            raise ValueError(f"unknown pip option(s) {unknown} in: {' '.join(command)}")
        requirements = tuple(w for w in rest if not w.startswith("-"))
        found.append(PipInstall(requirements, no_deps))
    return found
