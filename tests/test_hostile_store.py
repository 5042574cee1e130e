"""Damaged run folders and bad output paths: every command that reads a run says which file is damaged and what to
do (exit 2), and a damaged run elsewhere never breaks a command about another run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agl_cli.main import app
from tests.helpers import FIXTURES, run_agl, write_spec

AGENT = f"python {FIXTURES / 'hostile_agent.py'} {{task_file}} {{output_file}}"
GRADER = f"python {FIXTURES / 'hostile_grader.py'} {{task_file}} {{output_file}}"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """Two small finished eval runs of one spec, made once; each test damages copies of them."""
    folder = tmp_path_factory.mktemp("runs")
    write_spec(folder, [{"id": f"t{i}", "answer": "1"} for i in range(3)], agent={"command": AGENT},
               grader={"command": GRADER})
    runs = []
    for _ in range(2):
        result = run_agl(["eval", "agl.yaml", "--json", "--no-report", "--no-cache"], cwd=folder)
        assert result.returncode == 0, result.stderr
        runs.append(Path(json.loads(result.stdout)["run_dir"]))
    return folder, runs


def _copy(two_runs: tuple[Path, list[Path]], tmp_path: Path) -> tuple[Path, list[Path]]:
    folder, runs = two_runs
    root = tmp_path / "runs"
    copies = []
    for run in runs:
        shutil.copytree(run, root / run.name)
        copies.append(root / run.name)
    shutil.copy(folder / "agl.yaml", tmp_path / "agl.yaml")
    shutil.copy(folder / "tasks.jsonl", tmp_path / "tasks.jsonl")
    return root, copies


def _refused(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


def _garbage(path: Path) -> None:
    path.write_bytes(b"this is not a database, just some text that happens to be here\n" * 64)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage", [_garbage, _truncate])
def test_a_damaged_store_is_named_by_every_command(two_runs: tuple[Path, list[Path]], tmp_path: Path,
                                                   damage: object) -> None:
    root, (bad, good) = _copy(two_runs, tmp_path)
    for leftover in bad.glob("store.sqlite-*"):
        leftover.unlink()
    damage(bad / "store.sqlite")  # type: ignore[operator]
    where = str(bad / "store.sqlite")
    commands = [
        ["report", bad.name, "--runs-dir", str(root)],
        ["compare", good.name, bad.name, "--runs-dir", str(root)],
        ["eval", "--resume", bad.name, "--runs-dir", str(root)],
        ["gateway", "export", bad.name, "--runs-dir", str(root)],
    ]
    for args in commands:
        text = _refused(args)
        assert where in text and "damaged" in text, (args, text)
    # A damaged run is no reason for a command about another run to fail.
    result = CliRunner().invoke(app, ["report", good.name, "--runs-dir", str(root), "--format", "md"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["runs", "--runs-dir", str(root), "--json"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("content", ['{"kind": "eval", "spec_pa', "[1, 2]", "\xff\xfe", '{"kind": "eval"}'])
def test_a_damaged_manifest_is_named_by_every_command(two_runs: tuple[Path, list[Path]], tmp_path: Path,
                                                      content: str) -> None:
    root, (bad, good) = _copy(two_runs, tmp_path)
    (bad / "manifest.json").write_bytes(content.encode("latin-1"))
    where = str(bad / "manifest.json")
    commands = [["eval", "--resume", bad.name, "--runs-dir", str(root)]]
    if content != '{"kind": "eval"}':  # an eval manifest that lacks keys only stops resuming it
        commands += [["optimize", "--resume", bad.name, "--runs-dir", str(root)], ["train", "--resume", str(bad)],
                     ["report", bad.name, "--runs-dir", str(root)]]
    for args in commands:
        text = _refused(args)
        assert where in text and "damaged" in text, (args, text)
    # compare reads only the stores, so it still works.
    assert CliRunner().invoke(app, ["compare", good.name, bad.name, "--runs-dir", str(root)]).exit_code == 0
    result = CliRunner().invoke(app, ["runs", "--runs-dir", str(root), "--json"])
    assert result.exit_code == 0, result.output
    listed = {r["run_id"]: r for r in json.loads(result.output)["runs"]}
    assert listed[good.name]["kind"] == "eval"
    # A new eval's result cache reads every run folder: a damaged one is skipped, not fatal.
    spec = tmp_path / "agl.yaml"
    result = run_agl(["eval", str(spec), "--json", "--no-report", "--runs-dir", str(root)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_export_into_a_missing_folder_is_a_usage_error(two_runs: tuple[Path, list[Path]], tmp_path: Path) -> None:
    root, (run, _) = _copy(two_runs, tmp_path)
    text = _refused(["gateway", "export", run.name, "--runs-dir", str(root), "--out", str(tmp_path / "no" / "x.jsonl")])
    assert f"the folder {tmp_path / 'no'} does not exist" in text and "mkdir -p" in text
    text = _refused(["gateway", "export", run.name, "--runs-dir", str(root), "--out", str(tmp_path)])
    assert "is a folder" in text
    result = CliRunner().invoke(app, ["gateway", "export", run.name, "--runs-dir", str(root),
                                      "--out", str(tmp_path / "calls.jsonl")])
    assert result.exit_code == 0 and (tmp_path / "calls.jsonl").is_file()


def test_a_symlink_to_a_run_is_that_run_not_a_second_one(two_runs: tuple[Path, list[Path]], tmp_path: Path) -> None:
    root, (run, other) = _copy(two_runs, tmp_path)
    (root / "zz-link").symlink_to(run, target_is_directory=True)
    (root / "00-link").symlink_to(run, target_is_directory=True)
    elsewhere = tmp_path / "archive" / "20240101-000000-arch"
    shutil.copytree(other, elsewhere)
    (root / "20240101-000000-arch").symlink_to(elsewhere, target_is_directory=True)  # a run linked in: counted once
    spend = CliRunner().invoke(app, ["spend", "--runs-dir", str(root), "--json"])
    assert spend.exit_code == 0, spend.output
    doc = json.loads(spend.output)
    assert sorted(r["run_id"] for r in doc["runs"]) == sorted([run.name, other.name, elsewhere.name])
    assert doc["rollouts"] == 9  # three runs of three rollouts: no run counted twice
    listed = json.loads(CliRunner().invoke(app, ["runs", "--runs-dir", str(root), "--json"]).output)["runs"]
    assert sorted(r["run_id"] for r in listed) == sorted([run.name, other.name, elsewhere.name])
