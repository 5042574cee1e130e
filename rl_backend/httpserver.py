"""Run an ASGI app under uvicorn on a background thread, on a port the OS picks, for in-process servers.

`agl eval` and the tests start the gateway and the embedded model server this way; `stop()` shuts down
gracefully (in-flight requests finish) and joins the thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import uvicorn


class ServerThread:
    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                 http: Any = "auto") -> None:
        self.host = host
        self._config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
            # Keep-alive long enough that a client pool never races the server closing an idle socket.
            timeout_keep_alive=30,
            http=http,  # uvicorn's choice, or a protocol class (the gateway's limits a request's arrival in time)
        )
        self._server = uvicorn.Server(self._config)
        self._thread = threading.Thread(target=self._run, name=f"uvicorn-{host}", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve())
        except BaseException as exc:  # surfaced by start()
            self._error = exc

    def start(self, timeout_s: float = 60.0) -> ServerThread:
        self._thread.start()
        done = threading.Event()

        def wait() -> None:
            while not self._server.started and self._thread.is_alive():
                done.wait(0.01)
            done.set()

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        waiter.join(timeout_s)
        if not self._server.started:
            self.stop()
            raise RuntimeError(f"server on {self.host} did not start: {self._error or 'timed out'}")
        return self

    @property
    def port(self) -> int:
        servers = getattr(self._server, "servers", [])
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        raise RuntimeError("server has no bound socket")

    @property
    def base_url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
