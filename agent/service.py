"""Run the agent inside an existing asyncio program.

`tuimon-agent run` owns its process. A program that already has an event loop (a
scheduler plug-in, a notebook, a login-node service) uses `AgentService` instead:

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

from agent.node import AgentConfig, NodeAgent
from tuimon_core.ports import DEFAULT_PORT
from tuimon_core.serving.security import check_bind_rule, parse_listen
from tuimon_core.serving.service import Service


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
