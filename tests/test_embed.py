"""The agent and the relay inside a caller's own event loop: start, serve, stop cleanly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.node import AgentConfig
from agent.service import AgentService
from agent.sim.fake_nvml import FakeNvml
from tests.conftest import make_agent
from tuimon.model.cluster import ClusterState
from tuimon.relay import Relay, RelayConfig
from tuimon.sources.agent_stream import watching
from tuimon_core.serving.security import ConfigError


def _others() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_agent_and_relay_embedded_leave_nothing_running(proc_root: Path) -> None:
    before = _others()
    agent = make_agent(proc_root, FakeNvml(2), node_name="embedded")
    async with AgentService(agent.config, listen="127.0.0.1:0", agent=agent) as svc:
        assert svc.url.startswith("http://127.0.0.1:") and svc.port
        target = f"127.0.0.1:{svc.port}"
        async with Relay(RelayConfig(targets=[target], listen="127.0.0.1:0",
                                     interval=0.1)) as relay:
            viewer = ClusterState()
            async with watching([], viewer, relays=[f"127.0.0.1:{relay.port}"]):
                for _ in range(200):
                    node = viewer.nodes.get(target)
                    if node is not None and node.sample is not None and node.gpu_count == 2:
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("embedded agent not seen through embedded relay")
                assert node.name == "embedded"
    await asyncio.sleep(0)
    assert _others() == before, _others() - before
    assert agent._task is None or agent._task.done()


def test_embedded_services_keep_the_bind_rule() -> None:
    with pytest.raises(ConfigError, match="without a token"):
        AgentService(AgentConfig(node_name="x"), listen="0.0.0.0:0")
    with pytest.raises(ConfigError, match="without a token"):
        Relay(RelayConfig(targets=["n1"], listen="0.0.0.0:0"))
