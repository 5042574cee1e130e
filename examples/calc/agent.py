"""A small calculator agent on the official OpenAI SDK, written the way people write agents.

Run it on one task:

    python agent.py --task task.json --out answer.txt

It reads OPENAI_BASE_URL and OPENAI_API_KEY from the environment (under `agl`, the gateway sets them) and keeps its
own model name (AGENT_MODEL, default local/smollm2-135m-instruct: the model its agl.yaml serves, named as the
spec names it, upstream/model, so the gateway routes it there by name and no report warns of a fallback).
The model talks a plain-text tool protocol: it writes `CALC: <expression>`, the agent answers `RESULT: <value>`, and
the model finishes with `ANSWER: <number>`. Other settings: AGENT_PROMPT_FILE (system prompt, default
prompts/system.md), AGENT_MAX_TURNS (6), AGENT_TEMPERATURE (0).
"""

import argparse
import ast
import json
import operator
import os
import re
from pathlib import Path

from openai import OpenAI

MODEL = os.environ.get("AGENT_MODEL", "local/smollm2-135m-instruct")
MAX_TURNS = int(os.environ.get("AGENT_MAX_TURNS", "6"))
TEMPERATURE = float(os.environ.get("AGENT_TEMPERATURE", "0"))
PROMPT_FILE = os.environ.get("AGENT_PROMPT_FILE") or str(Path(__file__).parent / "prompts" / "system.md")

CALC = re.compile(r"CALC:\s*(.+)")
ANSWER = re.compile(r"ANSWER:\s*(.+)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """Evaluate + - * / and parentheses safely (no eval); return the value, or an error message."""
    expression = expression.replace("×", "*").replace("÷", "/").replace(",", "").split("=")[0].strip()

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            return -walk(node.operand) if isinstance(node.op, ast.USub) else walk(node.operand)
        raise ValueError("only numbers, + - * / and parentheses are allowed")

    try:
        value = walk(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def load_prompt(path: str) -> list[dict]:
    """The system prompt, then any example turns: lines that start with `User:` or `Assistant:` open a message."""
    messages = [{"role": "system", "content": ""}]
    for line in Path(path).read_text().splitlines():
        role, _, text = line.partition(":")
        if role in ("User", "Assistant"):
            messages.append({"role": role.lower(), "content": text.strip()})
        else:
            messages[-1]["content"] += line + "\n"
    return [{**m, "content": m["content"].strip()} for m in messages]


def solve(question: str) -> str:
    """Run the tool loop on one question and return the final answer text."""
    client = OpenAI()
    messages = load_prompt(PROMPT_FILE) + [{"role": "user", "content": question}]
    reply = ""
    for _ in range(MAX_TURNS):
        response = client.chat.completions.create(
            model=MODEL, messages=messages, temperature=TEMPERATURE, max_tokens=96, stop=["RESULT:"]
        )
        reply = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        calc, answer = CALC.search(reply), ANSWER.search(reply)
        if answer and not (calc and calc.start() < answer.start()):
            numbers = NUMBER.findall(answer.group(1).split("=")[-1])
            return numbers[0].replace(",", "") if numbers else answer.group(1).strip()
        if calc:  # run the first calculation the model asked for and hand back its result
            messages.append({"role": "user", "content": f"RESULT: {calculate(calc.group(1))}"})
        else:
            messages.append({"role": "user", "content": "Reply with CALC: <expression> or ANSWER: <number>."})
    return reply.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="a JSON file holding one task with a 'question'")
    parser.add_argument("--out", required=True, help="where to write the final answer")
    args = parser.parse_args()
    task = json.loads(Path(args.task).read_text())
    Path(args.out).write_text(solve(task["question"]) + "\n")


if __name__ == "__main__":
    main()
