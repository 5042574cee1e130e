#!/usr/bin/env python3
"""Print one rollout's transcript as JSON: the rollout (task, reward, grader detail, output, stderr) and every
model call it made, in order, with the messages sent, the reply, tokens, cost and latency.

Read a failing rollout's transcript before forming a hypothesis: what did the model see, what did it answer,
which tool call or format broke? Long strings keep their head and tail (--chars).

Examples:
  transcript.py 3f2a9c1e                    # a rollout id (or unique prefix) of the latest run
  transcript.py 3f2a9c1e --run 20250101-120000-ab12 --chars 4000
Read only; standard library only. It reads the rollout with `agl transcript RUN ROLLOUT --json --raw`, so agl must
be on PATH. Exit 0 on success, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True  # no __pycache__ inside an installed skill
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import agl, clip, emit, runs_dir_args  # noqa: E402

REQUEST_KEYS = ("model", "system", "instructions", "messages", "input", "prompt", "tools", "temperature",
                "reasoning_effort", "reasoning", "max_tokens", "max_output_tokens", "max_completion_tokens")
RESPONSE_KEYS = ("choices", "content", "output", "stop_reason", "usage")


def shorten(value: Any, chars: int) -> Any:
    if isinstance(value, str):
        return clip(value, chars)
    if isinstance(value, list):
        return [shorten(v, chars) for v in value]
    if isinstance(value, dict):
        return {k: shorten(v, chars) for k, v in value.items()}
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rollout", help="rollout id or unique prefix")
    parser.add_argument("--run", default="latest", help="run id, prefix, folder, or latest (default)")
    parser.add_argument("--runs-dir", help="where runs live (default ./.agl/runs or $AGL_HOME/runs)")
    parser.add_argument("--chars", type=int, default=1500, help="characters kept of each string (default 1500)")
    args = parser.parse_args(argv)

    doc = agl("transcript", args.run, args.rollout, "--raw", *runs_dir_args(args.runs_dir))
    (found,) = doc["rollouts"]  # agl refuses a prefix that matches no rollout, or several
    rollout, task = found["rollout"], found["task"]
    turns = []
    for i, call in enumerate(found["calls"], start=1):
        request, response = call["request"] or {}, call["response"]
        turns.append({
            "turn": i, "api": call["api"], "upstream": call["upstream"], "model": call["model"],
            "status_code": call["status_code"], "error": call["error"],
            "input_tokens": call["input_tokens"], "output_tokens": call["output_tokens"],
            "reasoning_tokens": call["reasoning_tokens"], "cost_usd": call["cost_usd"],
            "latency_s": call["latency_s"], "knobs_applied": call["knobs_applied"] or {},
            "request": shorten({k: request[k] for k in REQUEST_KEYS if k in request}, args.chars),
            "response": shorten({k: response[k] for k in RESPONSE_KEYS if k in response}, args.chars)
            if isinstance(response, dict) else None,
        })
    emit({
        "run_id": doc["run_id"],
        "rollout": shorten({k: rollout[k] for k in ("id", "variant", "task_id", "seed", "split", "attempt", "status",
                                                    "reward", "reward_source", "grader_detail", "failure", "error",
                                                    "exit_code", "output", "stderr_tail")}, args.chars),
        "task": shorten(task, args.chars),
        "duration_s": rollout["duration_s"],
        "calls": turns,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
