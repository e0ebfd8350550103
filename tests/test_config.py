"""The config file: named clusters, flags win, malformed files named with line and key."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster
from tuimon.config import ConfigFileError, load

ROOT = Path(__file__).resolve().parent.parent


def test_a_valid_file_loads_its_clusters(tmp_path: Path) -> None:
    f = tmp_path / "config.toml"
    f.write_text('[clusters.prod]\ntargets = ["gpu[001-004]:9477"]\nslo_target = 0.95\n'
                 'slo_days = 30\n[clusters.prod.provisioned]\n"/lustre/scratch" = 400\n'
                 '[clusters.prod.leaves]\nleaf1 = "gpu[001-002]"\n')
    clusters = load(f)
    prod = clusters["prod"]
    assert prod.slo_target == 0.95 and prod.slo_hours == 30 * 24
    assert prod.provisioned == {"/lustre/scratch": 400.0}
    assert prod.targets == ("gpu[001-004]:9477",) and prod.leaves == {"leaf1": "gpu[001-002]"}
    assert load(tmp_path / "absent.toml") == {}


@pytest.mark.parametrize(("text", "expected"), [
    ('[clusters.prod]\ntargets = ["a"]\nslo_targt = 0.9\n', r":3: clusters\.prod\.slo_targt: "
                                                              "unknown setting"),
    ('[clusters.prod]\n\ntargets = "gpu001"\n', r":3: clusters\.prod\.targets: expected a list"),
    ('[clusters.prod]\nslo_target = 1.5\n', r":2: clusters\.prod\.slo_target: must be between"),
    ('[clusters.prod\ntargets = []\n', r":1: not valid TOML"),
    ('theme = "x"\n', r":1: theme: unknown setting"),
    ('[clusters.prod.provisioned]\n"/scratch" = -4\n',
     r":1: clusters\.prod\.provisioned: values must be positive"),
])
def test_malformed_files_name_the_file_line_and_key(tmp_path: Path, text: str,
                                                    expected: str) -> None:
    f = tmp_path / "config.toml"
    f.write_text(text)
    with pytest.raises(ConfigFileError, match=str(f).replace(".", r"\.") + expected):
        load(f)


async def _tuimon(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tuimon.cli", *args, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_cluster_from_the_config_file_and_flags_win(tmp_path: Path,
                                                          unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    f = tmp_path / "config.toml"
    f.write_text(f'[clusters.lab]\nname = "the lab"\ntargets = {json.dumps(sim.targets)}\n'
                 'slo_target = 0.95\n')
    async with sim:
        code, out, err = await _tuimon("--config", str(f), "--cluster", "lab", "status",
                                       "--json")
        report = json.loads(out)
        assert report["nodes"]["up"] == 2
        # The file's SLO applies: 0.95 over 720 h is 36 h of budget; the healthy job's
        # ~0.91 burns it, said, but a few seconds of it raise no alert.
        job = report["jobs"]["llm-pretrain"]
        assert job["sli_1m"] < 0.95 and job["budget_hours"] == pytest.approx(36.0), job
        assert job["burn_rates"]["5m"] > 1.0 and job["burn_alert"] is None, job
        assert code == 0 and report["status"] == "ok", err
        code, out, err = await _tuimon("--config", str(f), "--cluster", "lab", "status",
                                       sim.targets[0], "--json")
        assert json.loads(out)["nodes"]["up"] == 1  # the flag's targets win
    code, _, err = await _tuimon("--config", str(f), "--cluster", "nope", "status")
    # status's usage errors are UNKNOWN (3): a monitoring system's 2 means critical.
    assert code == 3 and "no cluster 'nope'" in err and "clusters: lab" in err
    f.write_text("[clusters.lab]\nslo_target = 2\n")
    code, _, err = await _tuimon("--config", str(f), "--cluster", "lab", "status")
    assert code == 3 and f"{f}:2: clusters.lab.slo_target" in err


async def test_a_cluster_behind_prometheus_or_a_relay(tmp_path: Path,
                                                      unused_tcp_port_factory) -> None:
    """`prometheus = URL` makes `tuimon --cluster NAME` read Prometheus; `relay = HOST:PORT`
    connects to the relay."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens here once the socket closes
    f = tmp_path / "config.toml"
    f.write_text(f'[clusters.site]\nprometheus = "http://127.0.0.1:{dead}"\n'
                 'match = \'cluster="site"\'\n')
    code, _, err = await _tuimon("--config", str(f), "--cluster", "site", "--once")
    assert code == 2
    assert f"prometheus http://127.0.0.1:{dead}: cannot connect" in err, err

    from tuimon.relay import Relay, RelayConfig

    sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    async with sim, Relay(RelayConfig(targets=sim.targets, listen="127.0.0.1:0",
                                      interval=0.2)) as relay:
        f.write_text(f'[clusters.login]\nrelay = "127.0.0.1:{relay.port}"\n')
        code, out, err = await _tuimon("--config", str(f), "--cluster", "login", "--once")
    assert code == 0, err
    assert "nodes up 2" in out and "sim-node001" in out
