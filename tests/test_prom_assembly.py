"""`tuimon prom`'s reading of answers, with no server: the answers a real Prometheus
gave its queries over real exporter captures (recorded by tests/record_prom_answers.py
from the setup of tests/test_real_data.py) -> nodes -> the hello and sample frames an
agent would send. The same facts test_real_data checks through a live server hold here
on the recording alone, so a change to the assembly is tried in a second."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuimon.sources.prom_answers import read_answer
from tuimon.sources.prom_reading import AnswerReader, Read
from tuimon_core.protocol import Hello, Sample, decode, encode

RECORDED = Path(__file__).resolve().parent / "fixtures" / "recorded" / "prom_answers.json"
MIB = 1 << 20


def _recording() -> dict[str, Any]:
    return json.loads(RECORDED.read_text())


def _answers(raw: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, body in raw.items():
        error, series = read_answer(json.dumps(body).encode())
        assert series is not None, (name, error)
        out[name] = series
    return out


def _read(reader: AnswerReader, refresh: dict[str, Any], clock: float,
          held: bool = False) -> Read:
    answers = _answers(refresh["answers"])
    return reader.read(answers, reader.resolver(answers), clock=clock, ts=1e9 + clock,
                       gap=1.0, detail=frozenset(refresh["detail"]),
                       held=lambda _name: held, inventory_at=clock)


def _frames(read: Read) -> tuple[dict[str, Hello], dict[str, Sample]]:
    """Each node's frames, as the viewer's decoder passes them."""
    hellos, samples = {}, {}
    for name, frame in read.frames:
        back = decode(encode(frame))
        if isinstance(back, Hello):
            hellos[name] = back
        else:
            assert isinstance(back, Sample)
            samples[name] = back
    return hellos, samples


def test_the_recorded_answers_make_one_node_per_machine_with_its_gpus_ports_and_mounts() -> None:
    rec = _recording()
    host = rec["host"]
    reader = AnswerReader(every=1.0)
    first = _read(reader, rec["refreshes"][0], clock=100.0)
    hellos, samples = _frames(first)
    names = set(first.nodes)
    # One machine: dcgm-exporter's Hostname and node_exporter's uname are one node.
    assert host in names and "127.0.0.2" not in names
    assert [g.name for g in hellos[host].gpus] == ["NVIDIA L4"]
    g = samples[host].gpus[0]
    assert g["mem_reserved"] > 0 and g["mem_total"] >= g["mem_used"] + g["mem_reserved"]
    assert g.get("gr_active") is not None
    assert g.get("pcie_tx") is None  # only while its screen is open
    (port,) = samples[host].extra["fabric"]["ports"]
    assert port["id"] == "mlx5_0:1" and port["state_name"] == "ACTIVE"
    fs = {f["id"]: f for f in samples[host].extra["storage"]["filesystems"]}
    assert fs["/A"]["fstype"] == "nfs" and fs["/B"]["fstype"] == "nfs4"
    assert 2e9 < fs["/A"]["read_bytes_s"] < 8e9 and fs["/A"]["size"] > 0
    # Kubernetes' node label wins over the exporter pod's hostname; a container id or a
    # pod name is no node; a target with no GPU, host or port series makes none.
    assert "gpu-k8s-07" in names and "dcgm-exporter-wwwjh" not in names
    assert "424773df46e0" not in names and "127.0.0.6" in names
    assert "dcgm-exporter-sn5rp" not in names and "127.0.0.7" not in names
    assert "lke529760-766837-0a634ab30000" in names
    # MIG: the A800's GPU 0 is three 2g.20gb instances; memory summed, power once.
    gpus = dict(zip((i.index for i in hellos["msxf-hpc-64-35-ai"].gpus),
                    samples["msxf-hpc-64-35-ai"].gpus))
    g0 = gpus[0]
    assert g0["mig_mode"] == 1 and [m["gi"] for m in g0["mig"]] == [3, 5, 6]
    assert {m["profile"] for m in g0["mig"]} == {"2g.20gb"}
    assert g0["mem_total"] == 3 * (10 + 19957) * MIB and g0["mem_used"] == 30 * MIB
    assert g0["power"] == pytest.approx(78.446)
    assert "mig" not in gpus[1]
    assert samples["127.0.0.9"].gpus[0]["mig"][0]["profile"] == "2g.12gb"


def test_a_screen_opened_brings_the_nodes_every_value_and_unchanged_nodes_send_nothing(
        ) -> None:
    rec = _recording()
    host = rec["host"]
    reader = AnswerReader(every=1.0)
    _read(reader, rec["refreshes"][0], clock=100.0)
    second = _read(reader, rec["refreshes"][1], clock=101.0)
    _, samples = _frames(second)
    assert samples[host].gpus[0]["pcie_tx"] is not None  # DCGM_FI_PROF_PCIE_TX_BYTES
    a800 = samples["msxf-hpc-64-35-ai"].gpus[1]
    assert a800["pcie_tx"] is not None and a800["util"] is not None
    assert samples["127.0.0.9"].gpus[0]["tensor_active"] is not None  # a v2 exporter's
    # The same answers again, the viewer holding each node's whole sample: nothing is
    # sent, every node is as it was (the server scraped none anew).
    again = _read(reader, rec["refreshes"][1], clock=102.0, held=True)
    assert again.frames == [] and sorted(again.current) == sorted(second.nodes)
    # Not held (the viewer took only the overviews since): sent again, no new hello.
    resent = _read(reader, rec["refreshes"][1], clock=103.0)
    hellos, samples = _frames(resent)
    assert hellos == {} and set(samples) == set(second.nodes)


def test_the_reading_needs_no_http_client_and_no_model() -> None:
    """The assembly is pure: importing it loads neither aiohttp nor the viewer's
    ClusterState."""
    code = ("import sys, tuimon.sources.prom_reading\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp'"
            " or m in ('tuimon.model.cluster', 'tuimon.sources.prometheus')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("extra", [(), ("rack",), ("we'ird\"\\\nlabel", "\u00e9t\u00e9", "a\x00b")])
def test_a_series_identity_key_reads_every_identity_label_whatever_its_name(
        extra: tuple[str, ...]) -> None:
    """The key a series' node is found by holds each identity label's value, in order,
    None where absent: the labels a site names (--node-label) may carry any character."""
    from tuimon.sources.prom_nodes import identity_key, identity_labels

    ids = identity_labels(extra)
    key = identity_key(ids)
    for labels in ({}, {"instance": "gpu1:9400"}, {name: f"v{i}" for i, name in enumerate(ids)},
                   {ids[0]: "x", "gpu": "0", "__name__": "DCGM_FI_DEV_GPU_UTIL"}):
        assert key(labels) == tuple(labels.get(name) for name in ids)
