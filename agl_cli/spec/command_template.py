"""The placeholders of the agent's and the grader's command (`{task_file}`, `{output_file}`...), found and filled
in one way for every reader (the spec's check, the preflight, the runner, the grader).

A placeholder is `{name}`. `{{` and `}}` write a literal brace. Shell syntax with braces is left to the shell: a
`${VAR}` (what `$${VAR}` in agl.yaml becomes), `{a,b}`, or an awk program such as `{print $1}` is not a placeholder.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# `{{` or `}}`, or `{identifier}` not right after a `$` (a shell's `${VAR}` is the shell's).
_TOKEN = re.compile(r"\{\{|\}\}|(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def placeholders(template: str) -> set[str]:
    """The placeholder names `template` uses."""
    return {m.group(1) for m in _TOKEN.finditer(template) if m.group(1)}


def fill(template: str, values: Mapping[str, str]) -> str:
    """`template` with each placeholder replaced by its value (already quoted for the shell by the caller) and each
    doubled brace made single. A name without a value is a KeyError (the spec refuses unknown names first)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return match.group(0)[0]
        return values[name]

    return _TOKEN.sub(replace, template)
