"""`agl serve`: the embedded model server on its own, an OpenAI-compatible endpoint over a local model."""

from __future__ import annotations

from typing import Annotated

import typer

from agl_cli.cli_support import handle_errors


@handle_errors
def serve_command(
    model: Annotated[str, typer.Option(help="A known model name or a local Hugging Face folder.")] = (
        "smollm2-135m-instruct"
    ),
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
) -> None:
    """Serve a local model with OpenAI chat completions (token ids and logprobs on request, like vLLM)."""
    from agl_cli.errors import UsageError

    if host not in ("127.0.0.1", "localhost", "::1"):
        raise UsageError(f"refusing to serve the model on {host}: the embedded server has no authentication",
                         hint="bind 127.0.0.1 and put `agl gateway serve` in front of it")
    from rl_backend.serving.__main__ import main as serve_main

    serve_main(["--model", model, "--host", host, "--port", str(port)])
