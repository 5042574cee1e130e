"""Author the committed recordings (recordings/openai.jsonl, recordings/anthropic.jsonl) without an API key.

    python author_recording.py            # both recordings: runs every variant of agl.yaml and agl.anthropic.yaml
    python author_recording.py --only openai

NOT a live capture. It starts a stand-in for the two APIs on loopback that answers in their documented response
shapes (chat.completion with tool_calls and usage details; Messages `message` with text, thinking and tool_use
blocks, stop_reason and usage), then runs `agl eval` on each live spec with its upstream pointed at the stand-in
and `record_to:` set, so the recording is written by the same recorder, for the same requests, as a live run would.

The stand-in's "model" knows each task's answer and errs on purpose, at rates it sets per trap (ambiguous dates,
net-N payment terms, 1.234,50 amounts, distractor numbers, items to add up, CA$), per model, per reasoning setting
and per system prompt, with the error a model plausibly makes (day and month swapped, the PO number taken for the
invoice number, ...). Token counts are estimates (about 3.7 characters per token). The numbers an eval of these
recordings produces therefore show how agl measures and compares; they say nothing about the real models.
Re-record for real with a key: run `agl eval agl.yaml` (its `record_to:` writes recordings/live/openai.jsonl).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

KEY = "sk-author-not-a-real-key"
SNAPSHOTS = {
    "gpt-5-mini": "gpt-5-mini-2025-08-07", "gpt-5-nano": "gpt-5-nano-2025-08-07",
    "claude-haiku-4-5": "claude-haiku-4-5-20251001", "claude-sonnet-4-5": "claude-sonnet-4-5-20250929",
}
# How often a trap catches the stand-in (before the multipliers below), and what helps.
BASE_ERROR = {"ambiguous_date": 0.5, "net_terms": 0.7, "local_number_format": 0.4, "distractor_number": 0.45,
              "sum_items": 0.5, "dollar_currency": 0.6, "none": 0.02}
MODEL_FACTOR = {"gpt-5-mini": 0.55, "gpt-5-nano": 1.0, "claude-haiku-4-5": 0.7, "claude-sonnet-4-5": 0.35}
CAREFUL_FACTOR = {"ambiguous_date": 0.4, "net_terms": 0.6, "local_number_format": 0.35, "distractor_number": 0.5,
                  "sum_items": 1.0, "dollar_currency": 0.2, "none": 1.0}
B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def h(*parts: Any) -> bytes:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()


def unit(*parts: Any) -> float:
    return int.from_bytes(h(*parts)[:8], "big") / 2**64


def b62(n: int, *parts: Any) -> str:
    raw = int.from_bytes(h(*parts) + h("more", *parts), "big")
    out = ""
    for _ in range(n):
        raw, digit = divmod(raw, 62)
        out += B62[digit]
    return out


def tokens(text: str) -> int:
    return max(1, round(len(text) / 3.7))


def parse_amount(text: str) -> float:
    """'1.234,50 €' / '1,234.50' / "CHF 1'234.50" / '¥45,000' -> float."""
    digits = re.sub(r"[^\d,.']", "", text).replace("'", "")
    if re.search(r",\d{2}$", digits):
        digits = digits.replace(".", "").replace(",", ".")
    return float(digits.replace(",", ""))


def misread_amount(text: str, right: float) -> float:
    """What a model that reads 1.234,50 the US way gets."""
    digits = re.sub(r"[^\d,.]", "", text)
    if re.search(r",\d{2}$", digits):
        head = digits.split(",")[0]
        return float(head) if "." in head else float(digits.replace(",", ""))
    return round(right * 100) / 10000


class Task:
    def __init__(self, data: dict) -> None:
        self.data = data
        self.id = data["id"]
        self.doc = data["document"]
        self.expected = dict(data["expected"])
        self.traps = data["traps"]
        self.items = [parse_amount(m) for m in re.findall(r"^  .{28} (.+)$", self.doc, re.M)]
        self.customer = re.search(r"(?:Bill to|Customer): (.+)|Hello (.+?) team", self.doc)

    def customer_name(self) -> str:
        m = self.customer
        return (m.group(1) or m.group(2)).strip() if m else "Unknown"


class StandIn:
    """Decides what the stand-in model answers to one request; the API classes below put it in the API's shape."""

    def __init__(self, tasks: list[Task]) -> None:
        self.by_doc = {t.doc.strip(): t for t in tasks}

    def task_of(self, text: str) -> Task:
        m = re.search(r"<document>\n(.*)\n</document>", text, re.S)
        if not m or m.group(1).strip() not in self.by_doc:
            raise ValueError("stand-in: the request holds no known document")
        return self.by_doc[m.group(1).strip()]

    def decide(self, model: str, thinking: str, careful: bool, task: Task, tool_result: str | None) -> dict:
        """{'tool': 'sum_amounts'|'submit_fields', 'input': {...}, 'reasoning': int tokens, 'notes': [...]}"""
        strong = thinking not in ("minimal", "0")
        variant = (model, thinking, careful)

        def errs(trap: str, field: str) -> bool:
            p = BASE_ERROR[trap] * MODEL_FACTOR[model] * (0.55 if strong else 1.0)
            p *= CAREFUL_FACTOR[trap] if careful else 1.0
            # Common random numbers: a better variant errs on a subset of a worse one's tasks, plus a little noise.
            u = unit(task.id, field)
            if unit(variant, task.id, field, "noise") < 0.1:
                u = unit(variant, task.id, field)
            return u < p

        reasoning = 0 if not strong else 64 * (2 + len(task.traps) + int(unit(variant, task.id, "r") * 4))
        notes: list[str] = []
        if "sum_items" in task.traps and tool_result is None:
            p_tool = (0.95 if careful else 0.5) + (0.1 if strong else 0.0)
            if unit(variant, task.id, "tool") < p_tool:
                return {"tool": "sum_amounts", "input": {"amounts": task.items}, "reasoning": reasoning // 2,
                        "notes": ["The items have no total, so I add them with the tool."]}
        e = task.expected
        out = dict(e)
        trap_of = {t: t in task.traps for t in BASE_ERROR}
        if errs("none", "vendor"):
            out["vendor"] = task.customer_name()
        if trap_of["distractor_number"] and errs("distractor_number", "invoice_number"):
            m = re.search(r"replaces invoice (\S+),", task.doc)
            out["invoice_number"] = m.group(1) if m else out["invoice_number"]
            notes.append("Two invoice numbers appear; I take the one it replaces.")
        issued = dt.date.fromisoformat(e["issue_date"])
        if trap_of["ambiguous_date"] and errs("ambiguous_date", "issue_date"):
            swapped = dt.date(issued.year, issued.day, issued.month)
            out["issue_date"] = swapped.isoformat()
            notes.append("I read the numeric date month first.")
        if trap_of["net_terms"] and errs("net_terms", "due_date"):
            days = int(re.search(r"net (\d+)", task.doc).group(1))
            wrong = issued + dt.timedelta(days=days - 1) if days % 30 else _add_months(issued, days // 30)
            if wrong.isoformat() == e["due_date"]:
                wrong -= dt.timedelta(days=1)
            out["due_date"] = wrong.isoformat()
        elif e["due_date"] is None and errs("none", "due_date"):
            out["due_date"] = e["issue_date"]
        if tool_result is not None:
            out["total"] = float(tool_result)
        elif "sum_items" in task.traps and errs("sum_items", "total"):
            out["total"] = round(sum(task.items[:-1]), 2)
            notes.append("I add the items myself.")
        elif trap_of["local_number_format"] and errs("local_number_format", "total"):
            shown = re.search(r"(?:Total due:|amount is) ?(.+?)(?: for|\n|$)", task.doc)
            if shown:
                out["total"] = misread_amount(shown.group(1), e["total"])
        if trap_of["dollar_currency"] and errs("dollar_currency", "currency"):
            out["currency"] = "USD"
        notes.append(f"Fields: vendor {out['vendor']}, number {out['invoice_number']}, issued {out['issue_date']}, "
                     f"due {out['due_date']}, total {out['total']} {out['currency']}.")
        return {"tool": "submit_fields", "input": out, "reasoning": reasoning, "notes": notes}


def _add_months(day: dt.date, months: int) -> dt.date:
    month = day.month - 1 + months
    year, month = day.year + month // 12, month % 12 + 1
    for d in (day.day, 30, 29, 28):
        try:
            return dt.date(year, month, d)
        except ValueError:
            continue
    raise ValueError(day)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text") or b.get("content") or "") for b in content if isinstance(b, dict))
    return ""


def openai_reply(stand_in: StandIn, body: dict) -> dict:
    messages = body["messages"]
    model = body["model"]
    system = next((_text(m["content"]) for m in messages if m["role"] in ("system", "developer")), "")
    task = stand_in.task_of(next(_text(m["content"]) for m in messages if m["role"] == "user"))
    tool_result = next((m["content"] for m in messages if m["role"] == "tool"), None)
    d = stand_in.decide(model, body.get("reasoning_effort") or "medium", "careful about formats" in system, task, tool_result)
    key = json.dumps(body, sort_keys=True)
    arguments = json.dumps(d["input"], ensure_ascii=False, separators=(",", ":"))
    prompt = sum(tokens(_text(m.get("content")) or json.dumps(m.get("tool_calls"))) + 4 for m in messages)
    prompt += tokens(json.dumps(body.get("tools"))) + 3
    visible = tokens(arguments) + 9
    return {
        "id": "chatcmpl-" + b62(29, key),
        "object": "chat.completion",
        "created": 1_758_000_000 + int(unit(key, "t") * 3_000_000),
        "model": SNAPSHOTS[model],
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": "call_" + b62(24, key, "call"), "type": "function",
                                "function": {"name": d["tool"], "arguments": arguments}}],
                "refusal": None, "annotations": [],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }],
        "usage": {
            "prompt_tokens": prompt, "completion_tokens": visible + d["reasoning"],
            "total_tokens": prompt + visible + d["reasoning"],
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": d["reasoning"], "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
        },
        "service_tier": "default",
        "system_fingerprint": None,
    }


def anthropic_reply(stand_in: StandIn, body: dict) -> dict:
    messages = body["messages"]
    model = body["model"]
    system = _text(body.get("system"))
    task = stand_in.task_of(_text(messages[0]["content"]))
    tool_result = None
    for m in messages:
        if m["role"] == "user" and isinstance(m["content"], list):
            tool_result = next((str(b["content"]) for b in m["content"] if b.get("type") == "tool_result"), tool_result)
    budget = str((body.get("thinking") or {}).get("budget_tokens", 0))
    d = stand_in.decide(model, budget, "careful about formats" in system, task, tool_result)
    key = json.dumps(body, sort_keys=True)
    content: list[dict] = []
    if d["reasoning"]:
        thought = " ".join(d["notes"])
        signature = base64.b64encode(h(key, "sig") * 9).decode()
        content.append({"type": "thinking", "thinking": thought, "signature": signature})
    elif model == "claude-sonnet-4-5" or unit(key, "say") < 0.4:
        say = "I'll add up the line items first." if d["tool"] == "sum_amounts" else "I'll submit the extracted fields."
        content.append({"type": "text", "text": say})
    content.append({"type": "tool_use", "id": "toolu_01" + b62(22, key, "tool"), "name": d["tool"], "input": d["input"]})
    prompt = tokens(system) + sum(tokens(_text(m["content"]) or json.dumps(m["content"])) + 3 for m in messages)
    prompt += tokens(json.dumps(body.get("tools"))) + 346  # Anthropic's tool-use system prompt
    out = sum(tokens(b.get("text", "") or json.dumps(b.get("input"))) for b in content) + 12
    out += d["reasoning"]
    return {
        "id": "msg_01" + b62(22, key),
        "type": "message",
        "role": "assistant",
        "model": SNAPSHOTS[model],
        "content": content,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
            "output_tokens": out, "service_tier": "standard",
        },
    }


def stand_in_app(stand_in: StandIn) -> Starlette:
    async def chat(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {KEY}":
            return JSONResponse({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                           "param": None, "code": "invalid_api_key"}}, 401)
        body = await request.json()
        reply = openai_reply(stand_in, body)
        return JSONResponse(reply, headers={"x-request-id": "req_" + h(json.dumps(body, sort_keys=True)).hex()[:32]})

    async def messages(request: Request) -> JSONResponse:
        if request.headers.get("x-api-key") != KEY or not request.headers.get("anthropic-version"):
            return JSONResponse({"type": "error", "error": {"type": "authentication_error",
                                                            "message": "invalid x-api-key"}}, 401)
        body = await request.json()
        reply = anthropic_reply(stand_in, body)
        return JSONResponse(reply, headers={"request-id": "req_011C" + b62(20, json.dumps(body, sort_keys=True))})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/messages", messages, methods=["POST"])])


def author(spec_name: str, upstream: str, base_url: str, recording: Path, runs_dir: Path, extra: list[str]) -> dict:
    """Run `agl eval` on a copy of the live spec whose upstream is the stand-in, recording to `recording`."""
    text = (HERE / spec_name).read_text()
    line = re.search(rf"^  {upstream}: {{kind: .*}}$", text, re.M)
    assert line, f"{spec_name} has no `{upstream}:` upstream line"
    replaced = (f"  {upstream}: {{kind: {upstream}, base_url: \"{base_url}\", api_key_env: AGL_AUTHOR_KEY, "
                f"record_to: {recording.relative_to(HERE)}}}")
    tmp_spec = HERE / f".author-{spec_name}"
    tmp_spec.write_text(text.replace(line.group(0), replaced).replace("budget: {usd: 3.0}", ""))
    recording.unlink(missing_ok=True)
    env = {**os.environ, "AGL_AUTHOR_KEY": KEY}
    try:
        from agl_cli.spec.schema import load_spec
        from agl_cli.spec.variants import grid

        every = [arg for v in grid(load_spec(tmp_spec)) for arg in ("-v", v.name)]  # the whole grid, every task
        result = subprocess.run([sys.executable, "-m", "agl_cli", "eval", str(tmp_spec), "--json", "--quiet",
                                 "--runs-dir", str(runs_dir), *every, *extra], env=env, capture_output=True, text=True,
                                cwd=HERE)
    finally:
        tmp_spec.unlink(missing_ok=True)
    if result.returncode != 0:
        raise SystemExit(f"agl eval failed:\n{result.stderr[-3000:]}")
    lines = [json.loads(x) for x in recording.read_text().splitlines() if x.strip()]
    for entry in lines:
        entry.pop("elapsed_s", None)  # the stand-in's time means nothing
    lines.sort(key=lambda e: (e["model"], e["preview"], e["key"]))
    recording.write_text("".join(json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n" for e in lines))
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["openai", "anthropic"])
    parser.add_argument("--limit", type=int, help="only the first N tasks (to try it out)")
    args = parser.parse_args()
    from rl_backend.httpserver import ServerThread

    tasks = [Task(json.loads(x)) for x in (HERE / "tasks.jsonl").read_text().splitlines() if x.strip()]
    server = ServerThread(stand_in_app(StandIn(tasks))).start()
    jobs = [("agl.yaml", "openai", server.base_url + "/v1", HERE / "recordings" / "openai.jsonl"),
            ("agl.anthropic.yaml", "anthropic", server.base_url, HERE / "recordings" / "anthropic.jsonl")]
    try:
        with tempfile.TemporaryDirectory() as runs:
            for spec_name, upstream, url, recording in jobs:
                if args.only and args.only != upstream:
                    continue
                extra = ["--limit", str(args.limit)] if args.limit else []
                doc = author(spec_name, upstream, url, recording, Path(runs), extra)
                n = sum(1 for _ in recording.open())
                print(f"{recording.relative_to(HERE)}: {n} responses over {len(doc['variants'])} variants", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
