"""`python -m rl_backend.serving --model M --host H --port P`: serve a model until Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from .linear import SERVABLE
from .model_store import DEFAULT_MODEL, ModelNotAvailable
from .threads import THREADS_ENV


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rl_backend.serving", description=__doc__)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a known model name or a local Hugging Face directory")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 lets the OS pick a free port")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on CPU)")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument(
        "--threads", type=int, default=None,
        help=f"CPU threads (default: ${THREADS_ENV}, else the cores other processes leave idle, followed as it changes)",
    )
    ap.add_argument(
        "--precision", choices=SERVABLE, default="float32",
        help="the CPU runner's matrix products: float32 (agrees with the trainer), or bfloat16 (about twice as fast; "
        "for evaluation, its logprobs differ from the float32 model by about 1e-2)",
    )
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")

    from .server import start_embedded_server

    try:
        server = start_embedded_server(
            args.model,
            args.host,
            args.port,
            max_batch_size=args.max_batch_size,
            threads=args.threads,
            precision=args.precision,
            device=args.device,
            dtype=args.dtype,
            log_level=args.log_level,
        )
    except (ModelNotAvailable, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    # SIGTERM (docker stop, Kubernetes) stops as cleanly as Ctrl-C; SIGINT is set explicitly because a process
    # started in the background by a non-interactive shell inherits it ignored.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print(f"serving {server.model} at {server.base_url}/v1 (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        while not done.wait(1.0):
            pass
    finally:
        print("stopping", file=sys.stderr, flush=True)
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
