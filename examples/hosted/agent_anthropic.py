"""The same invoice-extraction agent on the official Anthropic SDK (Messages API with tool use).

Run it on one task:

    python agent_anthropic.py --task task.json --out fields.json

It reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY (under `agl`, the gateway sets them) and keeps its own model name
(AGENT_MODEL, default claude-haiku-4-5); agl.anthropic.yaml maps it to whichever model a variant serves and sets
the system prompt and the reasoning effort through the gateway (which turns an effort into an extended-thinking
budget). Run alone, AGENT_THINKING_BUDGET (0 = off; N >= 1024 = thinking with that many tokens) does the same.
Thinking blocks are sent back unchanged on the next turn, as the API requires. Settings: AGENT_PROMPT_FILE
(default prompts/basic.md), AGENT_MAX_TURNS (4).
"""

import argparse
import json
import os
from pathlib import Path

import anthropic
from tools import MAX_TURNS, NUDGE, SUBMIT_FIELDS, SUM_AMOUNTS, sum_amounts, system_prompt, user_message, write_output

MODEL = os.environ.get("AGENT_MODEL", "claude-haiku-4-5")
THINKING_BUDGET = int(os.environ.get("AGENT_THINKING_BUDGET", "0"))
TOOLS = [
    {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in (SUM_AMOUNTS, SUBMIT_FIELDS)
]


def as_param(block) -> dict:
    """A response block as the request block that sends it back (thinking keeps its signature)."""
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if block.type == "thinking":
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if block.type == "redacted_thinking":
        return {"type": "redacted_thinking", "data": block.data}
    return block.model_dump(exclude_none=True)


def extract(task: dict) -> dict | None:
    """Run the tool loop on one document; return the submitted fields, or None if the model never submitted."""
    client = anthropic.Anthropic(max_retries=2)
    options: dict = {"max_tokens": 1024}
    if THINKING_BUDGET:
        options = {"max_tokens": THINKING_BUDGET + 1024, "thinking": {"type": "enabled", "budget_tokens": THINKING_BUDGET}}
    messages: list[dict] = [{"role": "user", "content": user_message(task)}]
    for _ in range(MAX_TURNS):
        response = client.messages.create(model=MODEL, system=system_prompt(), messages=messages, tools=TOOLS, **options)
        messages.append({"role": "assistant", "content": [as_param(b) for b in response.content]})
        calls = [b for b in response.content if b.type == "tool_use"]
        if not calls:
            messages.append({"role": "user", "content": NUDGE})
        results = []
        for call in calls:
            if call.name == "submit_fields":
                return dict(call.input)
            result = sum_amounts(call.input) if call.name == "sum_amounts" else "error: unknown tool"
            results.append({"type": "tool_result", "tool_use_id": call.id, "content": result})
        if results:
            messages.append({"role": "user", "content": results})
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="a JSON file holding one task with a 'document'")
    parser.add_argument("--out", required=True, help="where to write the extracted fields (JSON)")
    args = parser.parse_args()
    write_output(args.out, extract(json.loads(Path(args.task).read_text())))


if __name__ == "__main__":
    main()
