"""An invoice-extraction agent on the official OpenAI SDK (Chat Completions with tool calls).

Run it on one task:

    python agent.py --task task.json --out fields.json

It reads OPENAI_BASE_URL and OPENAI_API_KEY (under `agl`, the gateway sets them) and keeps its own model name
(AGENT_MODEL, default gpt-5-mini); agl.yaml maps that name to whichever model a variant serves, and sets the
reasoning effort and the system prompt through the gateway. The model may call `sum_amounts` to add items, and
ends by calling `submit_fields`; the agent writes those fields as JSON. Settings: AGENT_PROMPT_FILE (system prompt,
default prompts/basic.md), AGENT_MAX_TURNS (4).
"""

import argparse
import json
import os
from pathlib import Path

from openai import OpenAI
from tools import MAX_TURNS, NUDGE, SUBMIT_FIELDS, SUM_AMOUNTS, sum_amounts, system_prompt, user_message, write_output

MODEL = os.environ.get("AGENT_MODEL", "gpt-5-mini")
TOOLS = [{"type": "function", "function": {**tool, "strict": True}} for tool in (SUM_AMOUNTS, SUBMIT_FIELDS)]


def extract(task: dict) -> dict | None:
    """Run the tool loop on one document; return the submitted fields, or None if the model never submitted."""
    client = OpenAI(max_retries=2)
    messages = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": user_message(task)}]
    for _ in range(MAX_TURNS):
        response = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        calls = message.tool_calls or []
        turn: dict = {"role": "assistant", "content": message.content}
        if calls:
            turn["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in calls
            ]
        messages.append(turn)
        if not calls:
            messages.append({"role": "user", "content": NUDGE})
        for call in calls:
            arguments = json.loads(call.function.arguments or "{}")
            if call.function.name == "submit_fields":
                return arguments
            result = sum_amounts(arguments) if call.function.name == "sum_amounts" else "error: unknown tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="a JSON file holding one task with a 'document'")
    parser.add_argument("--out", required=True, help="where to write the extracted fields (JSON)")
    args = parser.parse_args()
    write_output(args.out, extract(json.loads(Path(args.task).read_text())))


if __name__ == "__main__":
    main()
