"""One decode step of the embedded engine's fast runner at a full batch, straight on the runner (no server), by
context length: the compiled kernels (the attention; with C++, also the fused operations between the products and
float32's panel products) against torch's row-by-row attention, oneDNN's products and torch's operations, scripted
and Python steps.

    python bench/decode_step_bench.py                       # 8 sequences, contexts of about 64, 256 and 1024
    python bench/decode_step_bench.py --rows 4 --contexts 128 2048 --threads 1
    python bench/decode_step_bench.py --kernel-longest 100000   # the kernel for every row, however long

Every configuration runs in the same process on the same model copy; rounds interleave them, so load from other
processes falls on all alike. A figure is the median over rounds of the mean step time of `--steps` steps (after
warm-up steps that compile and specialise). Row r's context is the given length plus 13*r tokens, so rows differ.
The last line on stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

CONFIGS = {
    "scripted, attention kernel": {"scripted": True, "attention_kernel": True},
    "scripted, torch attention": {"scripted": True, "attention_kernel": False},
    "python, attention kernel": {"scripted": False, "attention_kernel": True},
    "python, torch attention": {"scripted": False, "attention_kernel": False},
}


def _step_ms(runner: Any, rows: int, context: int, steps: int) -> float:
    import torch

    prompts = [[1 + (r * 7 + j) % 1000 for j in range(context + 13 * r)] for r in range(rows)]
    with torch.inference_mode():
        seqs, logits = runner.prefill(prompts)
        tokens = logits.argmax(-1).tolist()
        for _ in range(4):  # TorchScript's profiling runs, the kernel's first build
            tokens = runner.decode(seqs, tokens).argmax(-1).tolist()
        start = time.perf_counter()
        for _ in range(steps):
            tokens = runner.decode(seqs, tokens).argmax(-1).tolist()
        elapsed = time.perf_counter() - start
    runner.release(seqs)
    return 1000 * elapsed / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernel-longest", type=int, default=None,
                    help="rows with more keys attend in torch even with the kernel (default: the runner's: none for "
                         "the native operator, 192 for the kernel built as C)")
    args = ap.parse_args()

    import torch

    from rl_backend.serving import llama_runner
    from rl_backend.serving.llama_runner import LlamaRunner
    from rl_backend.serving.model_store import load_model

    if args.kernel_longest is not None:
        llama_runner.KERNEL_LONGEST = llama_runner.NATIVE_KERNEL_LONGEST = args.kernel_longest
    torch.set_num_threads(args.threads)
    model = load_model("smollm2-135m-instruct").model
    runners = {name: LlamaRunner(model, prefix_cache_bytes=0, **kw) for name, kw in CONFIGS.items()}  # type: ignore[arg-type]
    samples: dict[str, dict[int, list[float]]] = {name: {c: [] for c in args.contexts} for name in CONFIGS}
    for round_ in range(args.rounds):
        for context in args.contexts:
            for name, runner in runners.items():
                ms = _step_ms(runner, args.rows, context, args.steps)
                samples[name][context].append(ms)
                print(f"round {round_ + 1}/{args.rounds}  context {context:5d}  {name:28s} {ms:7.1f} ms/step",
                      file=sys.stderr)
    medians = {name: {c: round(statistics.median(v), 2) for c, v in by.items()} for name, by in samples.items()}
    print(f"\nms per decode step at {args.rows} sequences (median of {args.rounds} rounds)", file=sys.stderr)
    print("context  " + "  ".join(f"{name:>28s}" for name in CONFIGS), file=sys.stderr)
    for context in args.contexts:
        print(f"{context:7d}  " + "  ".join(f"{medians[n][context]:28.1f}" for n in CONFIGS), file=sys.stderr)
    print(json.dumps({"bench": "decode_step", "rows": args.rows, "threads": args.threads, "steps": args.steps,
                      "kernel_longest": llama_runner.KERNEL_LONGEST,
                      "native_kernel_longest": llama_runner.NATIVE_KERNEL_LONGEST,
                      "rounds": args.rounds, "ms_per_step": medians, "samples": samples}))


if __name__ == "__main__":
    main()
