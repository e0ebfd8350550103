"""Serve an aiohttp application (the agent's or the relay's) on the caller's event loop.

The commands hand their application to `tuimon_core.serving.guard.serve`, which owns
the process. A program that already has an event loop (a scheduler plug-in, a
notebook, a login-node service) uses `Service` (or `agent.service.AgentService`,
`tuimon.relay.Relay`) instead. `stop()` (or leaving the `async with` block) closes
open streams and awaits every task the application started.
"""

from __future__ import annotations

import ssl
from types import TracebackType

from aiohttp import web

from tuimon_core.serving.guard import GuardedSite, bind, guard_of, runner_for
from tuimon_core.serving.security import ListenAddress


class Service:
    """An aiohttp application served on the caller's event loop."""

    def __init__(self, app: web.Application, listen: ListenAddress,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.app = app
        self.listen = listen
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        host = f"[{self.listen.host}]" if ":" in self.listen.host else self.listen.host
        return f"{scheme}://{host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("already started")
        sock = bind(self.listen)  # first: a port in use fails before anything starts
        self.port = sock.getsockname()[1]  # the port actually bound, for listen port 0
        runner = runner_for(self.app)
        try:
            await runner.setup()  # runs the app's cleanup_ctx start halves
            await GuardedSite(runner, sock, guard_of(self.app), self.ssl_context).start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            raise
        self._runner = runner

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()  # shutdown (closes streams), then cleanup_ctx halves

    async def __aenter__(self) -> Service:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()
