"""`agl serve`: the embedded model server on its own, an OpenAI-compatible endpoint over a local model."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from agl_cli.cli_support import handle_errors


@handle_errors
def serve_command(
    model: Annotated[str, typer.Option(help="A known model name or a local Hugging Face folder.")] = (
        "smollm2-135m-instruct"
    ),
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    threads: Annotated[Optional[int], typer.Option(  # noqa: UP045
        min=1, help="CPU threads for the model (default: $AGL_TORCH_THREADS, else the cores other processes leave "
        "idle, followed as the load changes).")] = None,
    precision: Annotated[str, typer.Option(
        help="The CPU runner's matrix products: float32 (agrees with the trainer) or bfloat16 (about twice as fast "
        "on CPUs with bfloat16 kernels, float32's speed on others; for evaluation only).")] = "float32",
) -> None:
    """Serve a local model with OpenAI chat completions (token ids and logprobs on request, like vLLM)."""
    from agl_cli.errors import UsageError

    if host not in ("127.0.0.1", "localhost", "::1"):
        raise UsageError(f"refusing to serve the model on {host}: the embedded server has no authentication",
                         hint="bind 127.0.0.1 and put `agl gateway serve` in front of it")
    if precision not in ("float32", "bfloat16"):
        raise UsageError(f"unknown precision {precision!r}", hint="use --precision float32 or --precision bfloat16")
    from rl_backend.serving.__main__ import main as serve_main

    args = ["--model", model, "--host", host, "--port", str(port), "--precision", precision]
    if threads is not None:
        args += ["--threads", str(threads)]
    raise typer.Exit(serve_main(args))
