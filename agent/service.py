"""Run the agent (or any tuimon aiohttp application) inside an existing asyncio program.

The commands (`tuimon-agent run`, `tuimon-agent relay`) hand their application to
`aiohttp.web.run_app`, which owns the process. A program that already has an event loop
(a scheduler plug-in, a notebook, a login-node service) uses `Service` instead:

    from agent.service import AgentService
    from agent.node import AgentConfig

    async with AgentService(AgentConfig(node_name="n1"), listen="127.0.0.1:9477") as svc:
        print("serving on", svc.url)
        ...                       # the agent samples and serves on the caller's loop

`stop()` (or leaving the block) closes open streams, stops sampling and awaits every
task the agent started; nothing is left running on the loop.
"""

from __future__ import annotations

import ssl
from types import TracebackType

from aiohttp import web

from agent.node import AgentConfig, NodeAgent
from agent.security import ListenAddress, check_bind_rule, parse_listen
from agent.serve import GuardedSite, bind, guard_of, runner_for
from tuimon_core.ports import DEFAULT_PORT


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


class AgentService(Service):
    """A node agent on the caller's loop, with the same security rules as the command:
    a non-loopback address needs a token (or insecure=True)."""

    def __init__(self, config: AgentConfig, *, listen: str = f"127.0.0.1:{DEFAULT_PORT}",
                 token: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 insecure: bool = False, agent: NodeAgent | None = None) -> None:
        from agent.server import build_app

        address = parse_listen(listen, DEFAULT_PORT)
        check_bind_rule(address, token, insecure)
        self.agent = agent or NodeAgent(config)
        super().__init__(build_app(self.agent, token=token), address, ssl_context)
