"""`agl runs RUN` on a large run: the table against `--json`, and the table as agl draws it against rich drawing it.

Run:  python bench/runs_table.py [--rollouts 2000] [--rounds 3]
Writes a run of N rollouts (two model calls each) with the run store's own writer, then times, in interleaved
rounds, `agl runs RUN` (the table, piped, as an agent reads it) and `agl runs RUN --json` as subprocesses, and in
this process the drawing of that table's rows by agl (console.plain_table) and by rich (what `agl runs` used before).
Prints one JSON line with the medians, the ratios and the machine's load average.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agl_cli.console import plain_table, print_table
from rl_backend.store.db import RunStore
from rl_backend.store.records import Api, CallRecord, RewardSource, Rollout, RolloutStatus

RUN_ID = "20250101-000000-big1"


def write_run(root: Path, rollouts: int) -> Path:
    folder = root / RUN_ID
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"run_id": RUN_ID, "kind": "eval", "status": "completed",
                                                      "created_at": 0.0, "seeds": 1}))
    store = RunStore(folder / "store.sqlite")
    rng = random.Random(0)
    store.upsert_variant("baseline", "h", {})
    calls = []
    for i in range(rollouts):
        rid = f"r{i:05d}-1"
        reward = rng.choice([0.0, 1.0, None])
        store.put_rollout(Rollout(
            id=rid, key=f"h/t{i:05d}/0", variant="baseline", task_id=f"t{i:05d}", status=RolloutStatus.succeeded
            if reward is not None else RolloutStatus.failed, reward=reward,
            reward_source=RewardSource.grader if reward is not None else RewardSource.none, started_at=i, ended_at=i + 1))
        for n in range(2):
            calls.append(CallRecord(call_id=f"{rid}-{n}", rollout_id=rid, api=Api.openai_chat, upstream="openai",
                                    request_model="gpt-4.1-mini", model="gpt-4.1-mini", request={"n": n},
                                    response={}, status_code=200, input_tokens=100, output_tokens=20,
                                    cost_usd=0.0001, started_at=i, ended_at=i + 0.5, latency_s=0.5))
    store.insert_calls(calls)
    store.close()
    return folder


def time_command(args: list[str], runs: Path) -> float:
    env = dict(os.environ, NO_COLOR="1")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agl_cli", "runs", RUN_ID, "--runs-dir", str(runs), *args], env=env,
                   stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def table_rows(runs: Path) -> tuple[list[str], list[list[str]]]:
    out = subprocess.run([sys.executable, "-m", "agl_cli", "runs", RUN_ID, "--runs-dir", str(runs), "--json"],
                         capture_output=True, text=True, check=True).stdout
    columns = ["rollout", "variant", "task", "seed", "split", "status", "reward", "calls", "cost"]
    rows = [[r["id"], r["variant"], r["task_id"], str(r["seed"]), r["split"] or "", r["status"],
             str(r["reward"]), str(sum(u["calls"] for u in r["calls"].values())), "$0.0002"]
            for r in json.loads(out)["rollouts"]]
    return columns, rows


def draw_rich(columns: list[str], rows: list[list[str]]) -> float:
    table = Table(title="run", title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    started = time.perf_counter()
    print_table(Console(file=io.StringIO(), no_color=True, highlight=False, soft_wrap=True), table)
    return time.perf_counter() - started


def draw_plain(columns: list[str], rows: list[list[str]]) -> float:
    started = time.perf_counter()
    io.StringIO().write(plain_table("run", columns, rows))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        write_run(runs, args.rollouts)
        columns, rows = table_rows(runs)
        times: dict[str, list[float]] = {"table_s": [], "json_s": [], "draw_rich_s": [], "draw_agl_s": []}
        for _ in range(args.rounds):
            times["table_s"].append(time_command([], runs))
            times["json_s"].append(time_command(["--json"], runs))
            times["draw_rich_s"].append(draw_rich(columns, rows))
            times["draw_agl_s"].append(draw_plain(columns, rows))
    median = {k: round(statistics.median(v), 3) for k, v in times.items()}
    print(json.dumps({"rollouts": args.rollouts, "rounds": args.rounds, **median,
                      "table_over_json": round(median["table_s"] / median["json_s"], 2),
                      "rich_over_agl_drawing": round(median["draw_rich_s"] / median["draw_agl_s"], 1),
                      "load_average": os.getloadavg(), "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
