"""The agent's version: what a cached rollout must have been run with to be reused, and, when it was not, which part
changed.

    the spec's `agent`, `grader`, `model` and `upstreams` sections (each key hashed apart, so a change names its
    key), plus, when the spec's folder is in git, every file of that folder that git tracks or would track (its
    content hash: the index's for unchanged files, the working copy's for edited and untracked ones).

Left out, because they are accounted for elsewhere or are agl's own: the spec file itself (its other keys do not
change what an agent does, and its knobs are hashed per variant), the files the knobs offer as options (hashed by
content in the variants that choose them), `.agl/` and the `agl.best*` config agl writes. So adding a knob or a
prompt file keeps the agent's version. Outside git only the spec sections count, and an edit to the agent's code
is not seen: use --no-cache then.

Each run keeps the detail in `agent_version.json` beside its manifest (whose `agent_version` is the digest).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_cli.spec.schema import ExperimentSpec

VERSION_FILE = "agent_version.json"
_AGL_OWN = (".agl", "agl.best.yaml", "agl.best")  # written by agl itself, never the agent's code


def _git(folder: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode("utf-8", errors="surrogateescape") if out.returncode == 0 else None


def _blob_hash(path: Path) -> str:
    """git's own hash of a file's content, so an unchanged file hashes as the index has it."""
    try:
        data = path.read_bytes()
    except OSError:
        return "unreadable"
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _excluded(relative: str, skip: set[str]) -> bool:
    parts = relative.split("/")
    return relative in skip or any(part in _AGL_OWN for part in parts)


def source_files(folder: Path, skip: set[str] | None = None) -> dict[str, str] | None:
    """Path (relative to `folder`) -> content hash of every file git tracks or would track there; None outside git."""
    skip = skip or set()
    staged = _git(folder, "ls-files", "-s", "-z", "--", ".")
    if staged is None:
        return None
    files: dict[str, str] = {}
    for entry in filter(None, staged.split("\0")):
        meta, _, name = entry.partition("\t")
        files[name] = meta.split()[1]
    # Edited since the index (deleted ones included), and untracked files git does not ignore: hashed as they are.
    edited = _git(folder, "ls-files", "-m", "-z", "--", ".") or ""
    untracked = _git(folder, "ls-files", "-o", "--exclude-standard", "-z", "--", ".") or ""
    for name in filter(None, (edited + untracked).split("\0")):
        path = folder / name
        if path.is_file():
            files[name] = _blob_hash(path)
        else:
            files.pop(name, None)
    return {name: digest for name, digest in sorted(files.items()) if not _excluded(name, skip)}


def _flat(prefix: str, value: Any) -> dict[str, str]:
    """Each leaf of a section as `section.key.subkey` -> a hash of its value (an agent's env may hold secrets)."""
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flat(f"{prefix}.{key}", item))
        return out
    return {prefix: hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]}


def _spec_keys(spec: ExperimentSpec) -> dict[str, str]:
    keys = _flat("agent", spec.agent.model_dump(mode="json"))
    keys.update(_flat("grader", spec.grader.model_dump(mode="json")))
    keys.update(_flat("model", spec.model))
    for name, upstream in sorted(spec.upstreams.items()):
        keys.update(_flat(f"upstreams.{name}", upstream.model_dump(mode="json")))
    return keys


def _own_files(spec: ExperimentSpec, spec_file: Path | None) -> set[str]:
    """The spec file and the knobs' option files, relative to the spec's folder (those inside it)."""
    folder = spec.base_dir.resolve()
    paths = [spec.resolve(f) for knob in spec.knobs.values() for f in knob.option_files()]
    if spec_file is not None:
        paths.append(spec_file)
    own = set()
    for path in paths:
        try:
            own.add(path.resolve().relative_to(folder).as_posix())
        except ValueError:
            continue
    return own


@dataclass(frozen=True)
class AgentVersion:
    digest: str
    spec_keys: dict[str, str]  # `agent.command`, `upstreams.openai.base_url`, ... -> hash of the value
    files: dict[str, str] | None  # path in the spec's folder -> content hash; None outside git

    def changes_since(self, earlier: AgentVersion) -> list[str]:
        """What differs from an earlier version: spec keys (`agent.command`) and files (`agent.py`), a few of each."""
        keys = sorted(k for k in self.spec_keys.keys() | earlier.spec_keys.keys()
                      if self.spec_keys.get(k) != earlier.spec_keys.get(k))
        changed = [f"agl.yaml `{k}`" for k in keys]
        if (self.files is None) != (earlier.files is None):
            changed.append("the spec's folder " + ("left" if self.files is None else "entered") + " git")
        elif self.files is not None and earlier.files is not None:
            names = sorted(n for n in self.files.keys() | earlier.files.keys()
                           if self.files.get(n) != earlier.files.get(n))
            changed += [n if n in self.files and n in earlier.files else f"{n} ({'added' if n in self.files else 'deleted'})"
                        for n in names]
        return changed

    def as_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "spec_keys": self.spec_keys, "files": self.files}

    def write(self, run_path: Path) -> None:
        (run_path / VERSION_FILE).write_text(json.dumps(self.as_json(), sort_keys=True) + "\n")

    @classmethod
    def read(cls, run_path: Path) -> AgentVersion | None:
        """A run's recorded version; None for a run made before agl kept it, or a damaged file."""
        try:
            data = json.loads((run_path / VERSION_FILE).read_text(encoding="utf-8"))
            return cls(str(data["digest"]), dict(data["spec_keys"]),
                       None if data["files"] is None else dict(data["files"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def describe_agent(spec: ExperimentSpec, spec_file: Path | None = None) -> AgentVersion:
    """The agent's version as the spec (read from `spec_file`) and its folder are now."""
    keys = _spec_keys(spec)
    files = source_files(spec.base_dir, _own_files(spec, spec_file))
    material = {"spec": keys, "files": files}
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]
    return AgentVersion(digest, keys, files)
