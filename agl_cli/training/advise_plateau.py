"""Have prompt-level gains plateaued? The attempts recorded (finished studies, decided journal entries), the chain of
kept baselines they form, and the undecided changes that still lean better.

Each gain is measured against its own baseline, so gains add up only along a chain: a kept attempt continues the
latest earlier kept attempt it was measured on top of (its baseline is that attempt's kept candidate, or a run made
after it), and an attempt measured against an older state continues from the kept attempt that state came from, or
starts a chain of its own when it predates them all (then its gain already contains what was kept since). The
chains form a tree; its largest total is what prompt-level work gained since the first baseline. The plateau
criterion looks at the last PLATEAU_WINDOW attempts only: the gain along the chain within them.
"""

from __future__ import annotations

from typing import Any

from agl_cli.metrics.fmt import points
from agl_cli.training.advise_criterion import FAIL, PASS, UNKNOWN, Criterion
from agl_cli.training.advise_evidence import Evidence

PLATEAU_WINDOW = 3
PLATEAU_MIN_GAIN = 0.02


def attempts(ev: Evidence) -> list[dict[str, Any]]:
    """Prompt-level attempts in time order: each finished study, each decided journal entry; each with what it was
    measured against (`baseline_run`, `baseline_variant`) and what it kept (`candidate_run`, `candidate_variant`)
    where that is known."""
    found = []
    for run in ev.runs:
        result = run.study_result
        if run.kind != "study" or not result or result.get("recommendation") is None:
            continue
        confirmation = result.get("confirmation") or {}
        gain = (confirmation.get("difference") or {}).get("mean")
        accepted = result.get("recommendation") == "adopt"
        variants = run.manifest.get("variants") or [{}]
        found.append({"time": run.created_at, "source": f"study {run.run_id}", "accepted": accepted,
                      "gain": float(gain) if accepted and gain is not None else 0.0,
                      "baseline_run": run.run_id, "baseline_variant": variants[0].get("name"),
                      "candidate_run": run.run_id, "candidate_variant": (result.get("winner") or {}).get("name")})
    for entry in ev.journal:
        decision = entry.get("decision")
        if decision not in ("kept", "reverted"):
            continue
        gain = entry.get("difference")
        accepted = decision == "kept"
        found.append({"time": float(entry.get("time", 0.0)), "source": f"journal: {entry.get('change', '?')}",
                      "accepted": accepted,
                      "gain": float(gain) if accepted and isinstance(gain, (int, float)) else 0.0,
                      **{k: entry.get(k) for k in ("baseline_run", "baseline_variant", "candidate_run",
                                                   "candidate_variant")}})
    return sorted(found, key=lambda a: a["time"])


def extends(attempt: dict[str, Any], head: dict[str, Any]) -> bool:
    """Whether `attempt` was measured against what the kept attempt `head` produced, or a later state: a baseline
    in a run made after head's candidate (run ids sort by creation time), or head's candidate itself. Without run
    ids, as the skill works: each attempt is measured against the last kept change."""
    base, kept = attempt.get("baseline_run"), head.get("candidate_run")
    if not base or not kept:
        return True
    return bool(base > kept or (base == kept and attempt.get("baseline_variant") == head.get("candidate_variant")))


def parents(found: list[dict[str, Any]]) -> dict[int, int | None]:
    """For each kept attempt (by index), the kept attempt its chain continues: the latest earlier one it extends."""
    links: dict[int, int | None] = {}
    for i, attempt in enumerate(found):
        if attempt["accepted"]:
            links[i] = next((j for j in sorted(links, reverse=True) if extends(attempt, found[j])), None)
    return links


def chain_of(i: int, links: dict[int, int | None], within: set[int] | None = None) -> list[int]:
    """The kept attempts of the chain ending at `i`, oldest first (only those in `within`, when given)."""
    chain: list[int] = []
    node: int | None = i
    while node is not None and (within is None or node in within):
        chain.append(node)
        node = links[node]
    return chain[::-1]


def chain_gain(found: list[dict[str, Any]]) -> float:
    """The largest accuracy gain along a chain of kept baselines: gains measured against different baselines are
    never added up (an attempt against an older baseline already contains what was kept since)."""
    links = parents(found)
    return max((sum(found[j]["gain"] for j in chain_of(i, links)) for i in links), default=0.0)


def _described(attempt: dict[str, Any]) -> str:
    if not attempt["accepted"]:
        return f"reverted ({attempt['source']})"
    against = (f" vs {attempt['baseline_run']}:{attempt['baseline_variant']}" if attempt.get("baseline_run") else "")
    return f"{points(attempt['gain'])} kept ({attempt['source']}{against})"


def plateau(ev: Evidence) -> Criterion:
    title = "prompt-level gains have plateaued"
    threshold = (f"last {PLATEAU_WINDOW} attempts gained < {100 * PLATEAU_MIN_GAIN:.0f} accuracy points, "
                 "summed along the chain of kept baselines")
    found = attempts(ev)
    if len(found) < PLATEAU_WINDOW:
        return Criterion("plateau", title, UNKNOWN, None, threshold,
                         f"{len(found)} attempt(s) recorded (studies and journal entries)",
                         f"keep improving prompts, tools and settings first: {PLATEAU_WINDOW - len(found)} more "
                         "attempt(s) judged by `agl compare` or `agl optimize`, each recorded in the journal")
    links = parents(found)
    window = set(range(len(found) - PLATEAU_WINDOW, len(found)))
    gain = max((sum(found[j]["gain"] for j in chain_of(i, links, window)) for i in links if i in window),
               default=0.0)
    detail = (f"last {PLATEAU_WINDOW}: " + "; ".join(_described(found[i]) for i in sorted(window))
              + f"; they gained {points(gain)} along the chain of kept baselines")
    if links:
        best = max(links, key=lambda i: sum(found[j]["gain"] for j in chain_of(i, links)))
        chain = chain_of(best, links)
        detail += (f"; since the first baseline {points(sum(found[j]['gain'] for j in chain))} along it ("
                   + ", ".join(f"{points(found[j]['gain'])} {found[j]['source']}" for j in chain) + ")")
    detail += f" ({len(found)} attempts recorded)"
    if gain >= PLATEAU_MIN_GAIN:
        return Criterion("plateau", title, FAIL, round(gain, 4), threshold, detail,
                         "prompt-level changes still pay: keep going before training")
    return Criterion("plateau", title, PASS, round(gain, 4), threshold, detail)


def undecided(ev: Evidence) -> list[dict[str, Any]]:
    """Journal entries that were not kept, whose comparison was undecided but leans better ("likely better,
    unproven"), unless a later entry kept the same change: each with what could decide it."""
    from agl_cli.metrics.more_evidence import likely_better

    kept = {e.get("change") for e in ev.journal if e.get("decision") == "kept"}
    found = []
    for entry in ev.journal:
        if entry.get("decision") == "kept" or entry.get("verdict") != "no detectable difference":
            continue
        if entry.get("change") in kept or not likely_better(entry.get("difference"), entry.get("ci95")):
            continue
        more = entry.get("more_evidence") or {}
        found.append({"change": entry.get("change"), "decision": entry.get("decision"),
                      "difference": entry.get("difference"), "ci95": entry.get("ci95"),
                      "n_tasks": entry.get("n_tasks"), "split": entry.get("split"),
                      "evidence_splits": [s for s in more.get("splits", []) if s.get("role") == "evidence"],
                      "pooled_tasks": more.get("pooled_tasks"), "tasks_likely_needed": more.get("tasks_likely_needed"),
                      "commands": more.get("commands", [])})
    return found


def undecided_line(item: dict[str, Any]) -> str:
    """One line per undecided change: what it measured, and the evidence that could decide it."""
    n = item["n_tasks"] if isinstance(item["n_tasks"], int) else "?"
    text = (f"likely better, unproven: {item['change']} ({item['decision']}): "
            f"{points(item['difference'], item['ci95'])} at n={n}")
    if item["evidence_splits"]:
        named = ", ".join(f"{s['split']} ({s['tasks']} tasks)" for s in item["evidence_splits"])
        text += (f"; more evidence from {named}, if the change was not tuned on it: {item['pooled_tasks']} tasks "
                 f"pooled" + (f" (about {item['tasks_likely_needed']} would likely decide it)"
                              if item["tasks_likely_needed"] else ""))
    else:
        text += "; put it to the user, or decide it with more tasks"
    return text
