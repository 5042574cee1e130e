#!/usr/bin/env python3
"""The optimization journal: one JSON line per hypothesis tried, in `.agl/journal.jsonl` (or
`$AGL_HOME/journal.jsonl`), next to the runs. `agl advise` reads it to judge whether prompt-level gains have
plateaued, so record every attempt, kept or reverted.

  journal.py add --hypothesis TEXT --lever LEVER[,LEVER] --change TEXT [--evidence TEXT]
                 [--compare-json FILE [--candidate NAME] | --verdict V --difference D]
                 [--test-compare-json FILE] --decision kept|reverted|pending
  journal.py show [--markdown]

A change that moved two levers at once (a new prompt written for a larger model) names both: `--lever prompt,model`
or `--lever prompt --lever model`; the entry keeps them in `levers`.

`--compare-json` takes the output of `agl compare A B --split val --json` (FILE, or - for stdin) and fills in
the baseline, candidate, split, verdict, difference, its interval and the number of tasks. When that compare
judged several candidates (`agl compare A B C`), `--candidate` names the one this entry is about (its variant
name, its reference, or RUN:variant). `--test-compare-json` takes the confirmation of the same candidate on the
held-out split (`agl compare ... --split test --json`) and records it as the entry's `test` field.
`kept` is refused unless the verdict is `better`, and refused when the test confirmation says `worse`: only
what the paired rule calls better, and what held-out tasks do not contradict, stays. An undecided change that
fits every limit and leans better is `pending`: put it to the user as "likely better, unproven", with the
evidence that could decide it (`agl compare` says which split and how many tasks), never drop it in silence.

`show --markdown` prints each entry's difference with its 95% interval and the number of tasks, for the decision
and for its test confirmation.

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


def _names(candidate: dict[str, Any]) -> set[str]:
    """What a user may call a compared candidate: its reference, its variant, or RUN:variant."""
    names = {str(candidate.get("ref")), str(candidate.get("variant"))}
    if candidate.get("run_id"):
        names.add(f"{candidate['run_id']}:{candidate.get('variant')}")
    return names - {"None"}


def from_compare(source: str, flag: str, wanted: list[str]) -> dict[str, Any]:
    """The comparison of one candidate: the only one, or the first of `wanted` names that matches one."""
    try:
        doc = json.loads(sys.stdin.read() if source == "-" else Path(source).read_text())
        comparisons = list(doc["comparisons"])
        comparisons[0]["candidate"]  # noqa: B018 - the shape check: a compare document names its candidates
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        fail(f"{flag} {source}: not the JSON document of `agl compare --json`")
    refs = [str(c.get("candidate", {}).get("ref")) for c in comparisons]
    chosen = [c for name in wanted for c in comparisons if name in _names(c.get("candidate", {}))][:1]
    if not chosen and len(comparisons) == 1 and not wanted:
        chosen = comparisons
    if not chosen:
        asked = f" has no candidate {wanted[0]!r}" if wanted else f" judged {len(comparisons)} candidates"
        fail(f"{flag} {source}{asked}; name one with --candidate: {', '.join(refs)}")
    one = chosen[0]
    baseline = doc.get("baseline") or {}
    candidate = one.get("candidate") or {}
    return {
        "baseline": baseline.get("ref"), "baseline_run": baseline.get("run_id"),
        "baseline_variant": baseline.get("variant"),
        "candidate": candidate.get("ref"), "candidate_run": candidate.get("run_id"),
        "candidate_variant": candidate.get("variant"),
        "split": doc.get("split"), "verdict": one.get("verdict"),
        "difference": (one.get("difference") or {}).get("mean"),
        "ci95": (one.get("difference") or {}).get("ci95"), "n_tasks": one.get("n_tasks"),
        "p_value": one.get("p_adjusted", one.get("p_value")),
        "baseline_mean": one.get("baseline_mean"), "candidate_mean": one.get("candidate_mean"),
        "more_evidence": one.get("more_evidence"),
    }


def levers(given: list[str]) -> list[str]:
    """The levers named, in order, each once: `--lever prompt,model` and `--lever prompt --lever model` alike."""
    names = [name.strip() for text in given for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in LEVERS]
    if unknown or not names:
        fail(f"--lever {', '.join(unknown) or '(empty)'}: each lever must be one of: {', '.join(LEVERS)}")
    return list(dict.fromkeys(names))


def add(args: argparse.Namespace) -> dict[str, Any]:
    named = levers(args.lever)
    entry: dict[str, Any] = {
        "time": time.time(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "hypothesis": args.hypothesis, "evidence": args.evidence, "lever": "+".join(named), "levers": named,
        "change": args.change,
        "spec": str(Path(args.spec).expanduser().resolve()) if args.spec else None,
        "baseline": args.baseline, "candidate": args.candidate, "split": args.split,
        "verdict": args.verdict, "difference": args.difference, "decision": args.decision, "note": args.note,
    }
    wanted = [args.candidate] if args.candidate else []
    if args.compare_json:
        entry.update({k: v for k, v in from_compare(args.compare_json, "--compare-json", wanted).items()
                      if v is not None})
    if args.test_compare_json:
        if args.compare_json == "-" and args.test_compare_json == "-":
            fail("only one of --compare-json and --test-compare-json can read stdin")
        # The held-out compare may be a run of its own: the same candidate, found by the names it went by.
        names = [*wanted, *(str(entry[k]) for k in ("candidate", "candidate_variant") if entry.get(k))]
        test = from_compare(args.test_compare_json, "--test-compare-json", names)
        if test["split"] and entry["split"] and test["split"] == entry["split"]:
            fail(f"--test-compare-json is on split {test['split']!r}, the split the decision was made on; "
                 "the confirmation must be on held-out tasks (agl compare ... --split test --json)")
        entry["test"] = test
    if entry["verdict"] is not None and entry["verdict"] not in VERDICTS:
        fail(f"--verdict must be one of: {', '.join(VERDICTS)}")
    if args.decision == "kept" and entry["verdict"] != "better":
        fail("only a change that `agl compare` calls `better` is kept; record this one as reverted or pending")
    if args.decision == "kept" and (entry.get("test") or {}).get("verdict") == "worse":
        fail("the test confirmation says `worse`: the change is not kept; record it as reverted")
    return entry


def _points(diff: Any, ci95: Any = None) -> str:
    """+6.9 pts [-0.7, +15.3]: the difference with its interval (the interval left out only when unknown)."""
    if not isinstance(diff, (int, float)):
        return ""
    text = f"{100 * diff:+.1f} pts"
    if isinstance(ci95, (list, tuple)) and len(ci95) == 2 and all(isinstance(x, (int, float)) for x in ci95):
        text += f" [{100 * ci95[0]:+.1f}, {100 * ci95[1]:+.1f}]"
    return text


def _n(value: Any) -> str:
    return str(value) if isinstance(value, int) else "?"


def markdown(entries: list[dict[str, Any]]) -> str:
    """One row per entry; every difference carries its 95% interval and n, the number of tasks it rests on."""
    lines = ["| date | levers | change | split | verdict | difference [95% CI] | n | decision | test confirmation |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        test = e.get("test") or {}
        confirmed = ""
        if test:
            confirmed = " ".join(part for part in (str(test.get("verdict") or ""),
                                                   _points(test.get("difference"), test.get("ci95")),
                                                   f"(n={_n(test.get('n_tasks'))})") if part)
        named = e.get("levers") or [e.get("lever", "")]
        decision = str(e.get("decision", ""))
        if decision == "pending" and (e.get("more_evidence") or {}).get("likely_better_unproven"):
            decision += ": likely better, unproven"
        cells = [str(e.get("date", "")), " + ".join(str(x) for x in named), str(e.get("change", "")),
                 str(e.get("split") or ""), str(e.get("verdict") or ""), _points(e.get("difference"), e.get("ci95")),
                 _n(e.get("n_tasks")) if e.get("verdict") else "", decision, confirmed]
        lines.append("| " + " | ".join(cell.replace("|", "/").replace("\n", " ") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--journal", help="the journal file (default .agl/journal.jsonl or $AGL_HOME/journal.jsonl)")
    parser.add_argument("--runs-dir", help="the runs folder whose journal to use (its parent holds journal.jsonl)")
    sub = parser.add_subparsers(dest="action", required=True)
    a = sub.add_parser("add", help="append one attempt")
    a.add_argument("--hypothesis", required=True, help="what you expect and why, in one sentence")
    a.add_argument("--evidence", help="what suggested it: failure kinds, transcripts, the cost breakdown")
    a.add_argument("--lever", required=True, action="append", metavar="LEVER[,LEVER]",
                   help=f"what was changed; several when one change moved two levers: {', '.join(LEVERS)}")
    a.add_argument("--change", required=True, help="what changed, e.g. a prompt file or a knob value")
    a.add_argument("--spec", help="the agl.yaml this attempt is about")
    a.add_argument("--compare-json", metavar="FILE", help="`agl compare --json` output to read (- for stdin)")
    a.add_argument("--test-compare-json", metavar="FILE",
                   help="the held-out confirmation: `agl compare ... --split test --json` of the same candidate")
    a.add_argument("--baseline", help="the baseline reference given to agl compare")
    a.add_argument("--candidate", help="the candidate this entry is about; picks it when a compare judged several")
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
