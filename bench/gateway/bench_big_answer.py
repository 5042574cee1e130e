"""What an answer too big to hold costs the gateway: the growth of `agl gateway serve`'s peak memory (VmHWM, from
/proc) and the time for one answer of N MB, whole and streamed, read by a client that keeps none of it.

Two processes: this script (the scripted fake upstream on a loopback thread, sending the answer in 64 KiB pieces, and
the client), and the gateway. The gateway keeps the first 8 MiB of such an answer in its record and passes the rest
through; before it held the whole answer several times over. Run:

    python bench/gateway/bench_big_answer.py [--mb 96] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from rl_backend.gateway.fake import FakeUpstream  # noqa: E402
from rl_backend.gateway.fake.procs import register, spawn_serve  # noqa: E402

GATEWAY_SERVE = [sys.executable, "-m", "agl_cli", "gateway", "serve"]
KEY = "sk-bench"


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc (Linux only)")


def one_answer(fake: FakeUpstream, base_url: str, token: str, pid: int, size: int, stream: bool) -> dict[str, Any]:
    before = peak_rss_mb(pid)
    fake.fail("huge", size=size)
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    received, t0 = 0, time.perf_counter()
    with httpx.stream("POST", base_url + "/chat/completions", json=body, headers={"authorization": f"Bearer {token}"},
                      timeout=300) as response:
        response.raise_for_status()
        for part in response.iter_bytes():
            received += len(part)
    return {"stream": stream, "answer_mb": round(received / 2**20, 1), "seconds": round(time.perf_counter() - t0, 2),
            "peak_rss_before_mb": round(before, 1), "peak_rss_growth_mb": round(peak_rss_mb(pid) - before, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=96, help="size of the answer's text, in MiB")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    fake = FakeUpstream(api_key=KEY).start()
    with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp:
        folder = Path(tmp)
        (folder / "agl.yaml").write_text(yaml.safe_dump({
            "upstreams": {"up": {"kind": "openai-compatible", "base_url": fake.base_url, "api_key_env": "BENCH_KEY"}},
            "model": "up/m",
        }))
        os.environ["BENCH_KEY"] = KEY
        gw = spawn_serve(GATEWAY_SERVE, [str(folder), "--store", str(folder / "store.sqlite")], admin_token="bench")
        try:
            reg = register(gw.url, "bench", "bench")
            rows = [one_answer(fake, reg["openai_base_url"], reg["token"], gw.pid, args.mb << 20, stream)
                    for stream in (False, True)]
        finally:
            gw.stop()
            fake.stop()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        kind = "streamed" if row["stream"] else "whole"
        print(f"{kind:9s} {row['answer_mb']:7.1f} MB in {row['seconds']:6.2f} s; gateway peak memory "
              f"{row['peak_rss_before_mb']:.0f} MB, +{row['peak_rss_growth_mb']:.0f} MB")


if __name__ == "__main__":
    main()
