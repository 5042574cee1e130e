"""The `reflect` strategy's proposer: the request it sends (the current prompt plus transcripts of failing rollouts,
read from the study's store), the LLM call itself, and what counts as a usable proposal in the reply.

The call goes through the study's own gateway, under a scope id of its own (`proposer-<n>`), with the official
`openai` or `anthropic` SDK as the upstream speaks: so it is recorded in the store with its tokens and cost, counts
toward the study's spend, and is refused like any call once the budget is spent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agl_cli.errors import UsageError
from agl_cli.evaluation.services import RunServices
from agl_cli.spec.schema import ExperimentSpec, ProposerSpec
from rl_backend.store.records import CallRecord, Rollout

# The meta-prompt is prose that people tune and review like any prompt, so it lives in a template file
# (templates/optimize/reflect.md.j2, shipped in the wheel with the other templates), not in this code.
TEMPLATE = "optimize/reflect.md.j2"
_TAGGED = re.compile(r"<prompt>(.*?)</prompt>", re.S)
_FENCED = re.compile(r"```[\w-]*\n(.*?)```", re.S)
PROPOSER_HINT = """add a proposer to agl.yaml (its model is upstream/model, the upstream declared under upstreams:):
  proposer:
    model: openai/gpt-4.1-mini   # or claude/claude-haiku-4-5, local/smollm2-135m-instruct
    rounds: 8                    # proposals to request
    knob: system_prompt          # the file-valued knob to rewrite (default: the only one)"""


def reflect_settings(spec: ExperimentSpec) -> tuple[ProposerSpec, str]:
    """The proposer and the knob it rewrites; a usage error when the spec has no proposer."""
    if spec.proposer is None:
        raise UsageError("--strategy reflect needs an LLM to propose prompts: the spec has no `proposer:` section",
                         hint=PROPOSER_HINT)
    try:
        knob = spec.proposer_knob()
    except ValueError as exc:
        raise UsageError(f"`proposer.knob`: {exc}") from None
    if spec.knobs[knob].options[0] is None:
        raise UsageError(f"--strategy reflect rewrites the baseline's prompt file, but knob {knob!r} starts with "
                         "`null` (the agent's own prompt, which agl cannot read)",
                         hint="put the agent's prompt in a file and list it first")
    return spec.proposer, knob


def cut(text: str, limit: int) -> str:
    """At most about `limit` characters, keeping the start and the end (where a failure usually shows)."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str) else json.dumps(p)
                 for p in content]
        return "\n".join(str(part) for part in parts)
    return json.dumps(content)


def _request_lines(request: dict[str, Any]) -> list[str]:
    lines = []
    if "system" in request:  # Anthropic messages
        lines.append(f"[system] {_text_of(request['system']).strip()}")
    for message in request.get("messages") or []:
        if isinstance(message, dict):
            lines.append(f"[{message.get('role', '?')}] {_text_of(message.get('content')).strip()}")
    if "instructions" in request:  # OpenAI responses
        lines.append(f"[instructions] {_text_of(request['instructions'])}")
    if "input" in request:
        lines.append(f"[input] {_text_of(request['input'])}")
    if "prompt" in request:  # OpenAI completions
        lines.append(f"[prompt] {_text_of(request['prompt'])}")
    return lines


def _reply_text(response: dict[str, Any] | None) -> str:
    if not response:
        return "(no response)"
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        message = first.get("message") or {}
        if isinstance(message, dict) and (message.get("content") or message.get("tool_calls")):
            calls = message.get("tool_calls")
            return _text_of(message.get("content") or "") + (f"\n[tool calls] {json.dumps(calls)}" if calls else "")
        if "text" in first:
            return str(first["text"])
    if isinstance(response.get("content"), list):  # Anthropic
        return _text_of(response["content"])
    if "output_text" in response:
        return str(response["output_text"])
    return json.dumps(response)


def render_transcript(rollout: Rollout, task: dict[str, Any], calls: list[CallRecord], limit: int) -> str:
    """One rollout as the proposer sees it: the task, the model calls (each message once), output and grade."""
    lines = [f"task: {json.dumps(task, ensure_ascii=False)}"]
    seen: set[str] = set()
    for index, call in enumerate(calls, start=1):
        lines.append(f"-- model call {index} --")
        for line in _request_lines(call.request):
            # A chat agent resends the whole conversation each turn: show each message once.
            if line not in seen:
                seen.add(line)
                lines.append(line)
        lines.append(f"[assistant] {_reply_text(call.response)}" if not call.error else f"[error] {call.error}")
    lines.append(f"agent output: {rollout.output if rollout.output is not None else '(none)'}")
    if rollout.grader_detail:
        lines.append(f"grader: {json.dumps(rollout.grader_detail, ensure_ascii=False)}")
    if rollout.error:
        lines.append(f"error: {rollout.error}")
    return cut("\n".join(lines), limit)


def outcome(rollout: Rollout) -> str:
    if rollout.reward is not None:
        return f"reward {rollout.reward:g}"
    return f"no reward ({rollout.failure.value if rollout.failure else rollout.status.value})"


def build_request(knob: str, prompt: str, transcripts: list[dict[str, str]]) -> str:
    """The message to the proposer; `transcripts` are {task_id, outcome, text}."""
    from agl_cli.templates import render

    return render(TEMPLATE, knob=knob, prompt=prompt.strip(), transcripts=transcripts)


def extract_prompt(reply: str) -> tuple[str | None, str | None]:
    """(the proposed prompt, None) or (None, why there is none). The last <prompt> block wins (a model may quote
    an example first); without tags, the last fenced block; else the whole reply."""
    tagged = _TAGGED.findall(reply)
    if tagged:
        text = tagged[-1].strip()
    elif "<prompt>" in reply:
        return None, "the reply opens <prompt> but never closes it (cut at proposer.max_tokens?)"
    else:
        fenced = _FENCED.findall(reply)
        text = (fenced[-1] if fenced else reply).strip()
    if not text:
        return None, "the reply holds no prompt (empty)"
    return text, None


def _same(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def check_proposal(text: str, parent: str, others: dict[str, str], max_chars: int) -> str | None:
    """Why a proposed prompt is not worth running, or None."""
    if len(text) > max_chars:
        return f"too long: {len(text)} characters, more than proposer.max_prompt_chars ({max_chars})"
    if _same(text, parent):
        return "identical to its parent"
    for name, other in others.items():
        if _same(text, other):
            return f"the same text as {name}"
    return None


@dataclass
class Reply:
    text: str | None  # None when the call failed
    finish_reason: str | None = None
    error: str | None = None


class ProposerClient:
    """Calls the proposer model through the running gateway, one scope id per proposal."""

    def __init__(self, services: RunServices, settings: ProposerSpec) -> None:
        upstream = settings.model.partition("/")[0]
        if services.gateway is None or not services.gateway_url or upstream not in services.upstreams:
            raise RuntimeError(f"the proposer's upstream {upstream!r} is not served by this study's gateway")
        self.services = services
        self.settings = settings
        self.api = services.upstreams[upstream].api
        self.timeout_s = services.upstreams[upstream].timeout_s

    def ask(self, scope: str, message: str) -> Reply:
        gateway = self.services.gateway
        assert gateway is not None
        token = gateway.register_rollout(scope)
        base = f"{self.services.gateway_url}/rollouts/{scope}"
        try:
            if self.api == "anthropic":
                return self._anthropic(base, token, message)
            return self._openai(base, token, message)
        except Exception as exc:  # any failure of the call is a rejected proposal, never a crashed study
            return Reply(None, error=cut(f"{type(exc).__name__}: {exc}", 500))
        finally:
            gateway.unregister_rollout(scope)

    def _openai(self, base: str, token: str, message: str) -> Reply:
        import openai

        # No SDK retries: the gateway already retries what is worth retrying, and each attempt is a paid call.
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key=token, max_retries=0, timeout=self.timeout_s)
        extra: dict[str, Any] = {}
        if self.settings.temperature is not None:
            extra["temperature"] = self.settings.temperature
        with client:
            response = client.chat.completions.create(
                model=self.settings.model, messages=[{"role": "user", "content": message}],
                # max_completion_tokens: newer OpenAI models refuse max_tokens; vLLM and the embedded server take both.
                max_completion_tokens=self.settings.max_tokens, **extra,
            )
        if not response.choices:
            return Reply("", None)
        choice = response.choices[0]
        return Reply(choice.message.content or "", choice.finish_reason)

    def _anthropic(self, base: str, token: str, message: str) -> Reply:
        import anthropic

        client = anthropic.Anthropic(base_url=f"{base}/anthropic", api_key=token, max_retries=0, timeout=self.timeout_s)
        extra: dict[str, Any] = {}
        if self.settings.temperature is not None:
            extra["temperature"] = self.settings.temperature
        with client:
            response = client.messages.create(
                model=self.settings.model, max_tokens=self.settings.max_tokens,
                messages=[{"role": "user", "content": message}], **extra,
            )
        text = "".join(block.text for block in response.content if block.type == "text")
        return Reply(text, response.stop_reason)
