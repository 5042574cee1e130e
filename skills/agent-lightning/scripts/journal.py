#!/usr/bin/env python3
"""The optimization journal: one JSON line per hypothesis tried, in `.agl/journal.jsonl` (or
`$AGL_HOME/journal.jsonl`), next to the runs. `agl advise` reads it to judge whether prompt-level gains have
plateaued, so record every attempt, kept or reverted.

  journal.py add --hypothesis TEXT --lever LEVER --change TEXT [--evidence TEXT]
                 [--compare-json FILE | --verdict V --difference D] --decision kept|reverted|pending
  journal.py show [--markdown]

`--compare-json` takes the output of `agl compare A B --split val --json` (FILE, or - for stdin) and fills in
the baseline, candidate, split, verdict, difference, its interval and the number of tasks. `kept` is refused
unless the verdict is `better`: only what the paired rule calls better stays.

Prints the entry (add) or the journal (show) as JSON. Exit 0 on success, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True  # no __pycache__ inside an installed skill
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import emit, fail  # noqa: E402

LEVERS = ("prompt", "output-contract", "tools", "model", "reasoning-effort", "retrieval", "routing", "repair",
          "settings", "training", "other")
VERDICTS = ("better", "worse", "no detectable difference")
DECISIONS = ("kept", "reverted", "pending")


def default_journal(runs_dir: str | None) -> Path:
    if runs_dir:
        return Path(runs_dir).expanduser().parent / "journal.jsonl"
    home = os.environ.get("AGL_HOME")
    return (Path(home) if home else Path.cwd() / ".agl") / "journal.jsonl"


def from_compare(source: str) -> dict[str, Any]:
    try:
        doc = json.loads(sys.stdin.read() if source == "-" else Path(source).read_text())
        first = doc["comparisons"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        fail(f"--compare-json {source}: not the JSON document of `agl compare --json`")
    return {
        "baseline": doc.get("baseline", {}).get("ref"), "candidate": first.get("candidate", {}).get("ref"),
        "split": doc.get("split"), "verdict": first.get("verdict"),
        "difference": (first.get("difference") or {}).get("mean"),
        "ci95": (first.get("difference") or {}).get("ci95"), "n_tasks": first.get("n_tasks"),
        "p_value": first.get("p_adjusted", first.get("p_value")),
    }


def add(args: argparse.Namespace) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "time": time.time(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "hypothesis": args.hypothesis, "evidence": args.evidence, "lever": args.lever, "change": args.change,
        "spec": str(Path(args.spec).expanduser().resolve()) if args.spec else None,
        "baseline": args.baseline, "candidate": args.candidate, "split": args.split,
        "verdict": args.verdict, "difference": args.difference, "decision": args.decision, "note": args.note,
    }
    if args.compare_json:
        entry.update({k: v for k, v in from_compare(args.compare_json).items() if v is not None})
    if entry["verdict"] is not None and entry["verdict"] not in VERDICTS:
        fail(f"--verdict must be one of: {', '.join(VERDICTS)}")
    if args.decision == "kept" and entry["verdict"] != "better":
        fail("only a change that `agl compare` calls `better` is kept; record this one as reverted or pending")
    return entry


def markdown(entries: list[dict[str, Any]]) -> str:
    lines = ["| date | lever | change | verdict | difference | decision |", "|---|---|---|---|---|---|"]
    for e in entries:
        diff = e.get("difference")
        shown = f"{100 * diff:+.1f} pts" if isinstance(diff, (int, float)) else ""
        cells = [str(e.get("date", "")), str(e.get("lever", "")), str(e.get("change", "")).replace("|", "/"),
                 str(e.get("verdict") or ""), shown, str(e.get("decision", ""))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--journal", help="the journal file (default .agl/journal.jsonl or $AGL_HOME/journal.jsonl)")
    parser.add_argument("--runs-dir", help="the runs folder whose journal to use (its parent holds journal.jsonl)")
    sub = parser.add_subparsers(dest="action", required=True)
    a = sub.add_parser("add", help="append one attempt")
    a.add_argument("--hypothesis", required=True, help="what you expect and why, in one sentence")
    a.add_argument("--evidence", help="what suggested it: failure kinds, transcripts, the cost breakdown")
    a.add_argument("--lever", required=True, choices=LEVERS)
    a.add_argument("--change", required=True, help="what changed, e.g. a prompt file or a knob value")
    a.add_argument("--spec", help="the agl.yaml this attempt is about")
    a.add_argument("--compare-json", metavar="FILE", help="`agl compare --json` output to read (- for stdin)")
    a.add_argument("--baseline", help="the baseline reference given to agl compare")
    a.add_argument("--candidate", help="the candidate reference given to agl compare")
    a.add_argument("--split", help="the split the comparison ran on")
    a.add_argument("--verdict", help="better, worse, or no detectable difference")
    a.add_argument("--difference", type=float, help="accuracy difference, candidate minus baseline (0.05 = 5 points)")
    a.add_argument("--decision", required=True, choices=DECISIONS)
    a.add_argument("--note", help="anything else worth remembering")
    s = sub.add_parser("show", help="print the journal")
    s.add_argument("--markdown", action="store_true", help="a Markdown table instead of JSON")
    args = parser.parse_args(argv)

    path = Path(args.journal).expanduser() if args.journal else default_journal(args.runs_dir)
    if args.action == "add":
        entry = add(args)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")
        emit({"journal": str(path), "entry": entry})
        return 0
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] \
        if path.is_file() else []
    if args.markdown:
        sys.stdout.write(markdown(entries))
    else:
        emit({"journal": str(path), "entries": entries})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
