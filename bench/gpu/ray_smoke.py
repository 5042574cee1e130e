"""Does a (slimmed) Ray start a local cluster here? ray.init(), a remote task, an actor, a runtime_env with env_vars
(which goes through Ray's runtime-env agent, as agl's launch does), shutdown; prints one JSON line, exits 0 on
success. It needs nothing of agl: run it with any Python that has the Ray to try (see bench/gpu/README.md)."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    import ray

    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"AGL_SMOKE": "carried"}})
    init_s = time.perf_counter() - started

    @ray.remote
    def square(x: int) -> int:
        return x * x

    @ray.remote
    class Counter:
        def __init__(self) -> None:
            self.n = 0

        def add(self, k: int) -> int:
            self.n += k
            return self.n

        def env(self) -> str:
            return os.environ.get("AGL_SMOKE", "")

    squares = ray.get([square.remote(i) for i in range(4)])
    counter = Counter.remote()  # type: ignore[attr-defined]
    ray.get(counter.add.remote(2))
    total = ray.get(counter.add.remote(3))
    env = ray.get(counter.env.remote())
    ray.shutdown()
    result = {"ray": ray.__version__, "ray_file": ray.__file__, "python": sys.version.split()[0],
              "init_s": round(init_s, 2), "squares": squares, "actor_total": total, "actor_env": env}
    ok = squares == [0, 1, 4, 9] and total == 5 and env == "carried"
    print(json.dumps({"ok": ok, **result}))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
