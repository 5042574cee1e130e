"""The harness's rules against reward hacking, shared by the agent loop (agent.py) and the grader (grade.py).

- `is_protected(path)`: test and configuration files. The grader drops every change to them from the agent's diff.
- `check_command(cmd)`: None when the harness may run a command, else the reason it refuses: edits to protected
  files, network access and package installs, and any path outside the repository (absolute paths, `..`, `~`).

The filter is a first line of defense that catches the obvious attempts and tells the model why. It is a regular
expression filter, not a sandbox: an obfuscated command can get past it, which is why the grader rebuilds the
repository from the original and takes only the agent's changes to non-test source files. For untrusted models,
also run each rollout in a container that holds only its workspace (`runner: kubernetes`).
"""

from __future__ import annotations

import re
import shlex

PROTECTED_NAMES = {"conftest.py", "pytest.ini", "setup.cfg", "pyproject.toml", "tox.ini", "setup.py", "noxfile.py"}
PROTECTED_DIRS = {"tests", "test", ".github"}

# A protected file named anywhere in a command.
_PROTECTED = re.compile(
    r"(?:^|[\s'\"=/(])(?:tests?/|\.github/|conftest\.py|pytest\.ini|setup\.cfg|setup\.py|pyproject\.toml|tox\.ini|"
    r"noxfile\.py|test_\w*\.py|\w+_test\.py)|(?:^|[\s'\"=(])tests?(?=$|[\s'\";)])"
)
# Something that writes, moves or deletes files.
_WRITES = re.compile(
    r">|\btee\b|\bsed\b[^|;&]*\s-i|\bperl\b[^|;&]*\s-[a-z]*i|\b(?:mv|cp|rm|rmdir|touch|truncate|dd|ln|chmod|install|"
    r"patch|unlink)\b|\bgit\s+(?:apply|checkout|restore|reset|stash|mv|rm)\b|open\(|\.write|write_text|write_bytes|"
    r"\bshutil\b|os\.(?:remove|unlink|rename|replace)|\.unlink\(|\.rename\("
)
_HARMLESS_REDIRECTS = re.compile(r"\d?>&\d|\d?>\s*/dev/null|&>\s*/dev/null")
_NETWORK = re.compile(
    r"\b(?:pip3?|pipx|uv|poetry|conda|mamba|micromamba|easy_install|ensurepip|apt|apt-get|aptitude|yum|dnf|apk|brew|"
    r"npm|npx|yarn|pnpm|curl|wget|ssh|scp|sftp|rsync|nc|ncat|netcat|telnet|ftp|socat)\b|"
    r"\bgit\s+(?:clone|fetch|pull|push|remote|submodule|ls-remote)\b|"
    r"\b(?:urllib|requests|httpx|aiohttp|http\.client|socket|ftplib|smtplib)\b|https?://"
)
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?[^\n]*\n(.*?)^\s*\1\s*$", re.S | re.M)
# A path outside the repository inside code or a token: '/etc', "../x", '~/x'.
_QUOTED_OUTSIDE = re.compile(r"['\"](?:/(?!dev/null\b)(?=[\w.~$*'\"-])|\.\./|\.\.['\"]|~)")


def _outside_token(token: str) -> bool:
    for value in (token, token.split("=", 1)[-1]):
        if value.startswith("/") and value != "/dev/null":
            return True
        if value.startswith("~") or value == ".." or value.startswith("../") or "/../" in value or value.endswith("/.."):
            return True
    return "$HOME" in token or "${HOME}" in token or bool(_QUOTED_OUTSIDE.search(token))


def _leaves_repository(command: str) -> bool:
    """Whether the command names a path outside the repository (heredoc bodies are read as code)."""
    bodies = [m.group(2) for m in _HEREDOC.finditer(command)]
    rest = _HEREDOC.sub(lambda m: m.group(0).split("\n", 1)[0], command)
    try:
        lexer = shlex.shlex(rest, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        tokens = rest.split()
    if any(_outside_token(t) for t in tokens) or re.search(r"(?:^|[;&|]\s*)cd\s*(?:$|[;&|])", rest):
        return True
    return any(_QUOTED_OUTSIDE.search(body) or "$HOME" in body for body in bodies)


def is_protected(path: str) -> bool:
    """Test and configuration files, which the agent must not change (and whose changes the grader drops)."""
    parts = path.strip("/").split("/")
    name = parts[-1]
    return (
        name in PROTECTED_NAMES
        or any(p in PROTECTED_DIRS for p in parts[:-1])
        or (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
    )


def check_command(command: str) -> str | None:
    """Why the harness refuses `command`, or None when it may run."""
    if _NETWORK.search(command):
        return "no network access and no package installs (pip, curl, wget, git clone, apt, ...): work offline"
    if _leaves_repository(command):
        return "stay inside the repository: use relative paths (no absolute paths, `..`, `~` or $HOME)"
    writes = _WRITES.search(_HARMLESS_REDIRECTS.sub(" ", command))
    if writes and _PROTECTED.search(command):
        return (
            "test and configuration files are read-only (tests/, test_*.py, conftest.py, pytest.ini, setup.cfg, "
            "pyproject.toml, tox.ini): fix the source code instead"
        )
    return None
