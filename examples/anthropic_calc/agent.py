"""The calc agent again, this time on the official Anthropic SDK (Messages API) instead of the OpenAI one.

Run it on one task:

    python agent.py --task task.json --out answer.txt

It reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment (under `agl`, the gateway sets them) and keeps
its own model name (AGENT_MODEL, default local/smollm2-135m-instruct: the model its agl.yaml serves, named as the
spec names it, so the gateway routes it there by name and no report warns of a fallback). On the embedded model,
the gateway translates each Messages call to an OpenAI chat completion and the answer back, so this agent runs
offline on SmolLM2-135M-Instruct. The tool protocol is the calc example's: the model writes `CALC: <expression>`,
the agent answers `RESULT: <value>`, and the model finishes with `ANSWER: <number>`. Settings: AGENT_PROMPT_FILE
(system prompt, default ../calc/prompts/system.md), AGENT_MAX_TURNS (6), AGENT_TEMPERATURE (0).
"""

import argparse
import ast
import json
import operator
import os
import re
from pathlib import Path

import anthropic

CALC_DIR = Path(__file__).resolve().parent.parent / "calc"
MODEL = os.environ.get("AGENT_MODEL", "local/smollm2-135m-instruct")
MAX_TURNS = int(os.environ.get("AGENT_MAX_TURNS", "6"))
TEMPERATURE = float(os.environ.get("AGENT_TEMPERATURE", "0"))
PROMPT_FILE = os.environ.get("AGENT_PROMPT_FILE") or str(CALC_DIR / "prompts" / "system.md")

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


def load_prompt(path: str) -> tuple[str, list[dict]]:
    """The system prompt and any example turns (lines starting `User:` / `Assistant:` open a message)."""
    system, turns = [], []
    for line in Path(path).read_text().splitlines():
        role, _, text = line.partition(":")
        if role in ("User", "Assistant"):
            turns.append({"role": role.lower(), "content": text.strip()})
        elif turns:
            turns[-1]["content"] += "\n" + line
        else:
            system.append(line)
    return "\n".join(system).strip(), [{**t, "content": t["content"].strip()} for t in turns]


def solve(question: str) -> str:
    """Run the tool loop on one question and return the final answer text."""
    client = anthropic.Anthropic(max_retries=2)
    system, messages = load_prompt(PROMPT_FILE)
    messages.append({"role": "user", "content": question})
    reply = ""
    for _ in range(MAX_TURNS):
        response = client.messages.create(
            model=MODEL, system=system, messages=messages, max_tokens=96, stop_sequences=["RESULT:"],
            # Newer SDKs dropped the `temperature` argument; the API and the gateway still take the field.
            extra_body={"temperature": TEMPERATURE},
        )
        reply = "".join(block.text for block in response.content if block.type == "text")
        # The whole reply goes back unchanged, so the next prompt extends this one token for token (for training).
        messages.append({"role": "assistant", "content": reply or "(no reply)"})
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
