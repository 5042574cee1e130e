"""What the two agents share: the two tools (as JSON Schema), the tool code, the prompt and the task's message.

`sum_amounts` adds money amounts exactly; `submit_fields` ends the task with the extracted fields. The OpenAI agent
wraps the schemas as `{"type": "function", ...}`, the Anthropic agent as `{"name", "input_schema"}`.
"""

import json
import os
from decimal import Decimal
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPT_FILE = os.environ.get("AGENT_PROMPT_FILE") or str(HERE / "prompts" / "basic.md")
MAX_TURNS = int(os.environ.get("AGENT_MAX_TURNS", "4"))

SUM_AMOUNTS = {
    "name": "sum_amounts",
    "description": "Add up a list of money amounts exactly. Use it instead of adding in your head.",
    "parameters": {
        "type": "object",
        "properties": {"amounts": {"type": "array", "items": {"type": "number"}, "description": "plain numbers"}},
        "required": ["amounts"],
        "additionalProperties": False,
    },
}
SUBMIT_FIELDS = {
    "name": "submit_fields",
    "description": "Submit the fields extracted from the document. Call it exactly once, at the end.",
    "parameters": {
        "type": "object",
        "properties": {
            "vendor": {"type": "string", "description": "the company that issued the document"},
            "invoice_number": {"type": "string"},
            "issue_date": {"type": "string", "description": "YYYY-MM-DD"},
            "due_date": {"type": ["string", "null"], "description": "YYYY-MM-DD, or null when none is given"},
            "total": {"type": "number", "description": "the amount due, as a plain number"},
            "currency": {"type": "string", "description": "ISO 4217 code, e.g. EUR"},
        },
        "required": ["vendor", "invoice_number", "issue_date", "due_date", "total", "currency"],
        "additionalProperties": False,
    },
}
NUDGE = "Call submit_fields with the fields of the document."


def system_prompt() -> str:
    return Path(PROMPT_FILE).read_text().strip()


def user_message(task: dict) -> str:
    return f"Extract the fields from this document.\n\n<document>\n{task['document'].strip()}\n</document>"


def sum_amounts(arguments: dict) -> str:
    """The tool: the exact sum, as text (what the model reads back)."""
    try:
        total = sum((Decimal(str(a)) for a in arguments.get("amounts") or []), Decimal(0))
    except (ArithmeticError, ValueError, TypeError):
        return "error: amounts must be a list of numbers"
    return f"{total:.2f}"


def write_output(path: str, fields: dict | None) -> None:
    """The agent's output: the submitted fields as JSON ({} when it never submitted)."""
    Path(path).write_text(json.dumps(fields or {}, ensure_ascii=False) + "\n")
