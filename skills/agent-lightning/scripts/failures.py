#!/usr/bin/env python3
"""Summarise one agl run's failures and its cost and latency breakdown, as JSON on stdout.

The evidence for the next hypothesis: which rollouts failed or have no reward and why (crash, timeout, grader
failure, low reward), the commonest error lines, examples with the agent's output and stderr, and per variant
where the money and the time go (by model: calls, tokens, cost, seconds in its calls summed as `latency_s_total`
and per call as `latency_s_per_call`; and the share of wall time spent waiting on model calls).
With --replies each example also carries the model's last reply, beside the agent's output: a right answer
that the agent misread shows there.

Examples:
  failures.py                                  # the latest run under ./.agl/runs
  failures.py 20250101-120000-ab12 --variant baseline --limit 5
  failures.py 20250101-120000-ab12 --replies --limit 100
  agl eval agl.yaml --split val --json | failures.py --eval-json -
Read only; standard library only. It reads the run with `agl runs RUN --json` (and, for --replies, `agl transcript
RUN --failing --replies-only --json`), so agl must be on PATH. Exit 0 on success, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True  # no __pycache__ inside an installed skill
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import TERMINAL, agl, clip, emit, fail, percentile, runs_dir_args  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", default="latest", help="run id, id prefix, run folder, or latest")
    parser.add_argument("--eval-json", metavar="FILE", help="read the run from `agl eval --json` output (- for stdin)")
    parser.add_argument("--runs-dir", help="where runs live (default ./.agl/runs or $AGL_HOME/runs)")
    parser.add_argument("--variant", help="only this variant")
    parser.add_argument("--split", help="only rollouts of this split")
    parser.add_argument("--below", type=float, default=0.5, help="a reward below this is a failure (default 0.5)")
    parser.add_argument("--limit", type=int, default=10, help="failure examples to include (default 10)")
    parser.add_argument("--chars", type=int, default=600, help="characters kept of each output or log (default 600)")
    parser.add_argument("--replies", action="store_true", help="add each example's last model reply (last_reply)")
    return parser.parse_args(argv)


def pick_run(args: argparse.Namespace) -> str:
    """The run to read, as agl takes it: an id, a prefix, `latest`, or the run folder an `agl eval --json` names."""
    if not args.eval_json:
        return str(args.run)
    try:
        text = sys.stdin.read() if args.eval_json == "-" else Path(args.eval_json).read_text()
        run_dir = json.loads(text)["run_dir"]
    except (OSError, ValueError, KeyError, TypeError):
        fail(f"--eval-json {args.eval_json}: not the JSON document of `agl eval --json`")
    return str(run_dir)


def call_breakdown(rollouts: list[dict[str, Any]]
                   ) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, dict[str, float]]]:
    """Per rollout and model: calls, tokens, cost, seconds in calls; and per rollout totals."""
    by_model: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rollouts:
        for name, used in r["calls"].items():
            stats = {"calls": used["calls"], "input_tokens": used["input_tokens"],
                     "output_tokens": used["output_tokens"], "cost_usd": used["priced_usd"],
                     "latency_s": used["latency_s"], "errors": used["failed_calls"],
                     "unpriced_calls": used["unpriced_calls"]}
            by_model[r["id"]][name] = {k: float(v or 0) for k, v in stats.items()}
            for key, value in by_model[r["id"]][name].items():
                totals[r["id"]][key] += value
    return by_model, totals


def summarise(rollouts: list[dict[str, Any]], by_model: dict, totals: dict, below: float) -> dict[str, Any]:
    finished = [r for r in rollouts if r["status"] in TERMINAL]
    scored = [r for r in finished if r["reward"] is not None]
    durations = [r["ended_at"] - r["started_at"] for r in finished if r["ended_at"] and r["started_at"]]
    models: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in finished:
        for name, stats in by_model.get(r["id"], {}).items():
            for key, value in stats.items():
                models[name][key] += value
    spent = sum(totals.get(r["id"], {}).get("cost_usd", 0.0) for r in finished)
    # A call without a price has an unknown cost: then so has the total (never the priced calls' sum as if complete).
    unpriced = int(sum(totals.get(r["id"], {}).get("unpriced_calls", 0.0) for r in finished))
    in_calls = sum(totals.get(r["id"], {}).get("latency_s", 0.0) for r in finished)
    return {
        "finished": len(finished),
        "not_finished": len(rollouts) - len(finished),
        "scored": len(scored),
        "passed": sum(1 for r in scored if r["reward"] >= below),
        "failed_scored": sum(1 for r in scored if r["reward"] < below),
        "missing_reward": len(finished) - len(scored),
        "missing_reasons": dict(Counter(r["failure"] or "unknown" for r in finished if r["reward"] is None)),
        "mean_reward": sum(r["reward"] for r in scored) / len(scored) if scored else None,
        "cost_usd": None if unpriced else round(spent, 6),
        "unpriced_calls": unpriced,
        "cost_per_rollout_usd": round(spent / len(finished), 6) if finished and not unpriced else None,
        "latency_s": {"p50": percentile(durations, 50), "p95": percentile(durations, 95)},
        # Seconds waiting on the model out of all rollout seconds: near 1, latency is the model's; near 0, the agent's.
        "model_time_share": round(in_calls / sum(durations), 3) if durations and sum(durations) > 0 else None,
        "by_model": {name: by_model_entry(stats) for name, stats in sorted(models.items())},
    }


def by_model_entry(stats: dict[str, float]) -> dict[str, float | None]:
    """One model's calls: counts as integers, the cost unknown when a call had no price, and the time in its calls
    both summed (`latency_s_total`, where the time goes) and per call (`latency_s_per_call`, over `calls`)."""
    calls = int(stats["calls"])
    entry: dict[str, float | None] = {
        "calls": calls, "errors": int(stats["errors"]), "unpriced_calls": int(stats["unpriced_calls"]),
        "input_tokens": int(stats["input_tokens"]), "output_tokens": int(stats["output_tokens"]),
        "cost_usd": None if stats["unpriced_calls"] else round(stats["cost_usd"], 6),
        "latency_s_total": round(stats["latency_s"], 6),
        "latency_s_per_call": round(stats["latency_s"] / calls, 6) if calls else None,
    }
    return entry


def example(r: dict[str, Any], totals: dict, chars: int) -> dict[str, Any]:
    used = totals.get(r["id"], {})
    detail = r["grader_detail"] or None
    return {
        "rollout_id": r["id"], "variant": r["variant"], "task_id": r["task_id"], "seed": r["seed"],
        "split": r["split"], "status": r["status"], "reward": r["reward"], "failure": r["failure"],
        "error": clip(r["error"], chars), "grader_detail": detail, "exit_code": r["exit_code"],
        "duration_s": (r["ended_at"] - r["started_at"]) if r["ended_at"] and r["started_at"] else None,
        "calls": int(used.get("calls", 0)), "output_tokens": int(used.get("output_tokens", 0)),
        "cost_usd": None if used.get("unpriced_calls") else round(used.get("cost_usd", 0.0), 6),
        "output": clip(r["output"], chars), "stderr_tail": clip(r["stderr_tail"], chars),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = agl("runs", pick_run(args), *runs_dir_args(args.runs_dir))
    by_model, totals = call_breakdown(run["rollouts"])
    rollouts = [r for r in run["rollouts"] if (args.variant is None or r["variant"] == args.variant)
                and (args.split is None or r["split"] == args.split)]
    failures = [r for r in rollouts
                if r["status"] in TERMINAL and (r["reward"] is None or r["reward"] < args.below)]
    examples = [example(r, totals, args.chars) for r in failures[: max(args.limit, 0)]]
    if args.replies and examples:
        # agl picks the same failures: finished, and no reward or one below --below.
        picked = [*(["--variant", args.variant] if args.variant else []), *(["--split", args.split] if args.split else [])]
        shown = agl("transcript", run["run_dir"], "--failing", "--below", str(args.below), "--replies-only",
                    "--limit", str(len(examples)), *picked)
        replies = {r["rollout_id"]: r["last_reply"] for r in shown["rollouts"]}
        for item in examples:
            item["last_reply"] = clip(replies.get(item["rollout_id"]), args.chars)
    variants: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rollouts:
        variants[r["variant"]].append(r)
    # A traceback's last line names the exception; that is what repeats across failing rollouts.
    error_lines = Counter(
        (r["error"] or "").strip().splitlines()[-1][:200] for r in failures if (r["error"] or "").strip()
    )
    emit({
        "run_id": run["run_id"], "run_dir": run["run_dir"], "kind": run["kind"], "spec": run["spec"],
        "split": args.split or run["split"], "below": args.below,
        "variants": {name: summarise(rs, by_model, totals, args.below) for name, rs in variants.items()},
        "failure_kinds": dict(Counter(r["failure"] or ("low_reward" if r["reward"] is not None else "unknown")
                                      for r in failures)),
        "common_errors": [{"line": line, "count": n} for line, n in error_lines.most_common(5)],
        "failures_total": len(failures),
        "failures": examples,
        "next": f"read a transcript: agl transcript {run['run_id']} ROLLOUT_ID; every failing rollout's last reply at "
                f"once: agl transcript {run['run_id']} --failing --replies-only --json",
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
