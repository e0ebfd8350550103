"""The agent judges its own node with the shared node-local rules and exports what holds
as `tuimon_finding` on /metrics, for Prometheus and Alertmanager to page on."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agent.files import FileTree
from agent.metrics import make_registry, render
from agent.node import AgentConfig, NodeAgent
from agent.sim.fake_nvml import FakeNvml
from tests.peers import require_amtool, require_promtool

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def findings_on_metrics(agent: NodeAgent) -> dict[tuple[str, str], str]:
    text = render(make_registry(agent)).decode()
    assert "# TYPE tuimon_finding gauge" in text  # declared even while nothing holds
    samples = [s for f in text_string_to_metric_families(text) if f.name == "tuimon_finding"
               for s in f.samples]
    assert all(s.value == 1 and s.labels["node"] == "node-a" for s in samples)
    keys = [(s.labels["kind"], s.labels["component"]) for s in samples]
    assert len(keys) == len(set(keys)), f"two findings share one series: {keys}"
    return {(s.labels["kind"], s.labels["component"]): s.labels["severity"]
            for s in samples}


async def test_the_agent_exports_its_findings_with_the_apps_hold_and_hysteresis(
        proc_root: Path) -> None:
    nvml = FakeNvml(2)
    clock = Clock()
    agent = NodeAgent(AgentConfig(node_name="node-a", root=str(proc_root), watch_xid=False),
                      files=FileTree(proc_root), nvml_loader=lambda: nvml, monotonic=clock)
    await agent.start(sampling=False)
    try:
        assert findings_on_metrics(agent) == {}  # present before any sample, empty
        await agent.sample_once()
        assert findings_on_metrics(agent) == {}
        nvml.gpus[0].ecc_uncorrected = 2
        nvml.gpus[1].clock_events = 0x40  # hardware thermal slowdown, with its effect:
        nvml.gpus[1].temp = 93  # the clock held down while the GPU has work
        nvml.gpus[1].util_gpu, nvml.gpus[1].sm_mhz = 95, 1400
        await agent.sample_once()
        # An uncorrected ECC error shows at once; throttling must hold a few seconds.
        assert findings_on_metrics(agent) == {("ecc", "node-a GPU 0"): "critical"}
        for _ in range(4):
            clock.now += 1.0
            await agent.sample_once()
        assert findings_on_metrics(agent) == {("ecc", "node-a GPU 0"): "critical",
                                              ("thermal", "node-a GPU 1"): "warning"}
        # What each says and when it began (Unix time, though judged on the agent's
        # monotonic clock), as the relay's are: the one alert rule's annotation reads them.
        text = render(make_registry(agent)).decode()
        families = {f.name: f.samples for f in text_string_to_metric_families(text)}
        began = {s.labels["kind"]: s.value for s in families["tuimon_finding_since_seconds"]}
        assert time.time() - 10 <= began["thermal"] <= time.time() - 3, began
        said = {s.labels["kind"]: s.labels["text"] for s in families["tuimon_finding_info"]}
        assert said["thermal"].startswith("node-a GPU 1 thermal"), said
        # The GPU cools: the finding stays a minute (no flapping), then clears.
        nvml.gpus[1].clock_events = 0x1
        clock.now += 1.0
        await agent.sample_once()
        assert ("thermal", "node-a GPU 1") in findings_on_metrics(agent)
        clock.now += 61.0
        await agent.sample_once()
        assert ("thermal", "node-a GPU 1") not in findings_on_metrics(agent)
        assert ("ecc", "node-a GPU 0") in findings_on_metrics(agent)
    finally:
        await agent.stop()


def _yaml_block(doc: str, first_line: str) -> str:
    block = re.search(r"```yaml\n(" + re.escape(first_line) + r".*?)```", doc, re.S)
    assert block is not None, f"the example {first_line!r} is missing from operations.md"
    return block.group(1)


def test_the_documented_paging_setup_is_valid(tmp_path: Path) -> None:
    """The Prometheus and Alertmanager configurations in docs/operations.md ("Paging on
    findings"), with `tuimon rules`' output where they load it, checked by the real
    promtool and amtool: what an admin copies works."""
    from tuimon.model.prom_rules import rules_yaml
    from tuimon.model.slo import Slo

    promtool, amtool = require_promtool(), require_amtool()
    doc = (ROOT / "docs" / "operations.md").read_text()
    rules = tmp_path / "tuimon.yml"
    rules.write_text(rules_yaml(Slo(0.9, 720)))
    token = tmp_path / "tuimon-relay.token"
    token.write_text("secret\n")
    prom = _yaml_block(doc, "# prometheus.yml").replace(
        "/etc/prometheus/rules/tuimon.yml", str(rules)).replace(
        "/etc/prometheus/tuimon-relay.token", str(token))
    (tmp_path / "prometheus.yml").write_text(prom)
    out = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 19 rules found" in out.stdout, out.stdout
    (tmp_path / "alertmanager.yml").write_text(_yaml_block(doc, "# alertmanager.yml"))
    out = subprocess.run([amtool, "check-config", str(tmp_path / "alertmanager.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_file_systems_finding_names_the_mount() -> None:
    from tuimon_core.findings import Finding

    slow = Finding("warning", "storage_latency", "slow", node="gpu012", fs="/home")
    assert slow.where == "gpu012 /home"
