"""Bounds by bytes as well as by count, wherever input from outside accumulates: what
the agent sends (its machine can hold more than a frame may), what a relay declares,
what a viewer subscribes to, what a recording inflates to, what Prometheus answers.
Each is cut or refused with a reason, and the rest goes on.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from aiohttp import web

from agent.sim.fake_nvml import FakeGpu, FakeNvml
from tests.conftest import make_agent, serve
from tests.test_hostile import fake_agents
from tests.trees import write
from tuimon.model.cluster import ClusterState
from tuimon.sources import agent_stream
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon_core.protocol import Batch, decode, encode, encode_map
from tuimon_core.protocol.fields import MAX_SHARED_FS


async def _until(check: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.05)


# -- the agent: what a machine holds, fitted to what its peers accept --------------------

ESCAPES = "/" + "\x1b" * 1100  # a mount path that cleaning makes 4,400 characters


def _crowded_node(root: Path) -> FakeNvml:
    """A node with a 5,000-character user name running on its GPU, 300 mounts of a
    shared file system (FUSE Weka) and one mount path of 1,100 escape characters."""
    long_user = "u" * 5000
    write(root / "etc/passwd", f"root:x:0:0::/root:/bin/sh\n{long_user}:x:4021:4021::/:/bin/sh\n")
    pid = 4242
    write(root / f"proc/{pid}/stat", f"{pid} (python) S 1 " + "0 " * 18 + "123 0\n")
    write(root / f"proc/{pid}/status", "Name:\tpython\nUid:\t4021\t4021\t4021\t4021\n")
    write(root / f"proc/{pid}/cmdline", "python\0train.py\0")
    mounts = [f"weka{i} /weka/{i:03d} fuse.weka rw 0 0" for i in range(300)]
    mounts.append(f"nfs1:/x {ESCAPES} nfs4 rw 0 0")
    write(root / "proc/self/mounts", "\n".join(mounts) + "\n")
    return FakeNvml([FakeGpu(0, procs=[(pid, 2**30)])])


async def test_the_agent_fits_a_crowded_machine_to_what_its_viewers_accept(
        proc_root: Path) -> None:
    """Before, each of these made every sample fail the viewer's checks and the node
    went stale: the user name past 4,096 characters, more than 256 shared mounts in the
    overview, a path that cleaning made longer than a string may be."""
    agent = make_agent(proc_root, _crowded_node(proc_root))
    async with serve(agent) as server:
        cluster = ClusterState()
        target = f"{server.host}:{server.port}"
        async with watching([target], cluster, StreamOptions(min_backoff=0.1)):
            node = cluster.nodes[target]
            await _until(lambda: node.sample is not None and node.sample.seq >= 3,
                         "three samples")
            assert node.status == "up" and cluster.protocol_errors == 0, node.reason
            sample = node.sample
    fs = sample.extra["storage"]["filesystems"]
    assert len(fs) == 301
    weird = next(f for f in fs if f["fstype"] == "nfs4")
    assert weird["id"].startswith("/\\x1b") and len(weird["id"]) <= 4096
    assert len(sample.extra["overview"]["fs_rows"]) == MAX_SHARED_FS
    user = sample.gpus[0]["processes"][0]["user"]
    assert user.startswith("uuuu") and len(user) <= 4096
    hello = decode(encode(agent.hello))
    assert any(f["fstype"] == "nfs4" for f in hello.extra["filesystems"])


async def test_a_frame_over_the_size_limit_is_cut_and_says_so(proc_root: Path) -> None:
    """A machine whose entity lists alone make a frame over 1 MiB (600 mounts whose
    names are control characters, four times longer once cleaned): the longest list is
    halved until the frame fits, and the sample says what was left out."""
    odd = "\x01" * 400
    mounts = [f"srv:/{odd}{i} /{odd}/{i} nfs4 rw 0 0" for i in range(600)]
    write(proc_root / "proc/self/mounts", "\n".join(mounts) + "\n")
    agent = make_agent(proc_root, FakeNvml(1))
    await agent.start(sampling=False)
    try:
        await agent.sample_once()
        sample = await agent.sample_once()
    finally:
        await agent.stop()
    data = encode(sample)
    assert len(data) <= (1 << 20)
    decoded = decode(data)
    kept = decoded.extra["storage"]["filesystems"]
    assert 0 < len(kept) < 600
    assert "of 600 filesystems left out" in decoded.extra["storage"]["errors"][
        "filesystems_cut"]


async def test_an_unwatched_agent_cuts_the_same_lists_for_metrics(proc_root: Path) -> None:
    """With no stream client the sampler makes no overview, but the frame is still fitted:
    /metrics lists the same file systems whether a viewer is connected or not."""
    odd = "\x01" * 400
    mounts = [f"srv:/{odd}{i} /{odd}/{i} nfs4 rw 0 0" for i in range(600)]
    write(proc_root / "proc/self/mounts", "\n".join(mounts) + "\n")
    agent = make_agent(proc_root, FakeNvml(1), interval=0.1)
    await agent.start()
    try:
        while agent.stats.samples < 2:
            await asyncio.sleep(0.05)
    finally:
        await agent.stop()
    assert agent.latest is not None and not agent.hub.clients
    assert "overview" not in agent.latest.extra
    storage = agent.latest.extra["storage"]
    assert 0 < len(storage["filesystems"]) < 600
    assert "of 600 filesystems left out" in storage["errors"]["filesystems_cut"]


async def test_a_failed_read_of_the_mount_table_keeps_the_file_systems(
        proc_root: Path) -> None:
    """A read of the mount table that fails (no descriptor left, a /proc hiccup) is not
    a node without file systems: the mounts read before stand, with the reason."""
    write(proc_root / "proc/self/mounts", "srv:/home /home nfs4 rw 0 0\n")
    agent = make_agent(proc_root, FakeNvml(1))
    await agent.start(sampling=False)
    try:
        await agent.sample_once()
        (proc_root / "proc/self/mounts").unlink()
        (proc_root / "proc/self/mounts").mkdir()  # reading it now fails
        agent.files.revalidate()  # the agent's slow cadence: its kept descriptor goes
        sample = await agent.sample_once()
    finally:
        await agent.stop()
    storage = sample.extra["storage"]
    assert [f["id"] for f in storage["filesystems"]] == ["/home"]
    assert "showing the mounts read before" in storage["errors"]["mounts"]
    assert [f["id"] for f in agent.hello.extra["filesystems"]] == ["/home"]


# -- a relay that declares without end ------------------------------------------------------


async def test_a_relay_declaring_new_nodes_without_end_is_bounded_and_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile upstream relay announcing thousands of new sources every quarter second
    (before, 1.66 GB in a minute and growing): the viewer takes up to its bound, refuses
    the rest, and says so as a finding on that relay."""
    monkeypatch.setattr(agent_stream, "MAX_RELAY_SOURCES", 3000)
    sent = [0]

    async def flood(ws: web.WebSocketResponse, _: web.Request) -> None:
        while True:
            names = [f"n{sent[0] + i:09d}.flood.example:9477" for i in range(2000)]
            sent[0] += len(names)
            await ws.send_bytes(encode(Batch(ts=time.time(), frames=[],
                                             sources=[(n, "up", None) for n in names])))
            await asyncio.sleep(0.25)

    async with fake_agents([flood]) as (relay,):
        cluster = ClusterState()
        async with watching([], cluster, StreamOptions(), relays=[relay]):
            await _until(lambda: sent[0] >= 10_000, "five floods")
            await asyncio.sleep(0.3)
    assert len(cluster.nodes) <= 3000
    problems = cluster.relay_problems[relay]
    assert "declared more nodes than one relay may carry" in problems["too many sources"]


async def test_a_relay_declaring_long_names_is_bounded_by_their_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same flood with names of 4 KB: the bound on their bytes stops it first."""
    monkeypatch.setattr(agent_stream, "MAX_RELAY_NAME_CHARS", 4 << 20)
    sent = [0]

    async def flood(ws: web.WebSocketResponse, _: web.Request) -> None:
        while True:
            names = [f"{sent[0] + i:09d}" + "x" * 4000 for i in range(200)]
            sent[0] += len(names)
            await ws.send_bytes(encode(Batch(ts=time.time(), frames=[],
                                             sources=[(n, "up", None) for n in names])))
            await asyncio.sleep(0.05)

    async with fake_agents([flood]) as (relay,):
        cluster = ClusterState()
        async with watching([], cluster, StreamOptions(), relays=[relay]):
            await _until(lambda: sent[0] >= 2000, "the names sent")
            await asyncio.sleep(0.3)
    assert len(cluster.nodes) * 4009 <= 4 << 20
    assert "4 MiB of names" in cluster.relay_problems[relay]["too many sources"]


def test_real_slurm_node_lists_are_taken_and_bombs_refused() -> None:
    """A large job's node list after failures is thousands of fragments; its names are
    counted by what they are (before, by the whole list's length each: refused)."""
    from tuimon_core.hostlist import TargetError, expand_hostlists

    fragmented = "gpu[" + ",".join(f"{i:04d}-{i + 1:04d}" for i in range(0, 8000, 3)) + "]"
    assert len(fragmented) > 20_000
    assert len(expand_hostlists([fragmented])) == 5334
    many = ",".join(f"n{i:05d}" for i in range(4096))
    assert len(expand_hostlists([many, "x1", "y[1-9]"])) == 4106
    with pytest.raises(TargetError, match="4 MiB of names"):
        expand_hostlists(["x" * 20_000 + "[1-99999]"])


async def test_a_subscribe_of_a_few_kilobytes_naming_gigabytes_is_refused(
        tmp_path: Path) -> None:
    """One 20 KB prefix in a host list of 99,999 names: under the name cap, but 2 GB of
    names. The relay refuses it at once with the reason (1003), and serves the rest."""
    from tuimon.relay import Relay, RelayConfig
    from tuimon_core.protocol import Subscribe

    bomb = "x" * 20_000 + "[1-99999]"
    async with Relay(RelayConfig(listen="127.0.0.1:0", ledger=None,
                                 targets=["127.0.0.1:1"])) as relay, \
            aiohttp.ClientSession() as session:
        ws = await session.ws_connect(f"http://127.0.0.1:{relay.port}/v1/stream")
        await ws.send_bytes(encode(Subscribe(nodes=[bomb])))
        msg = await asyncio.wait_for(ws.receive(), 10)
        while msg.type == aiohttp.WSMsgType.BINARY:
            msg = await asyncio.wait_for(ws.receive(), 10)
        assert ws.close_code == 1003
        assert "MiB of names" in (msg.extra or "")
        async with session.get(f"http://127.0.0.1:{relay.port}/healthz") as resp:
            assert resp.status == 200


def test_a_ledger_of_many_jobs_sends_viewers_the_most_recent_it_may(tmp_path: Path) -> None:
    """A relay's ledger holds every job of 30 days; its batch carries the 1024 seen most
    recently (before, over 4096 jobs made every batch undecodable: all its nodes lost)."""
    from tuimon.relay.ledger import Ledger
    from tuimon_core.protocol.fields import MAX_BUDGET_JOBS

    now = 1_800_000_000.0
    with Ledger(tmp_path / "l.db", clock=lambda: now) as ledger:
        for i in range(MAX_BUDGET_JOBS + 100):
            ledger.add(f"job{i:05d}", now - 86400 + 60 * i, 60.0, 50.0)
        ledger.flush()
        budget = ledger.summary()
    assert len(budget) == MAX_BUDGET_JOBS
    assert "job00000" not in budget and f"job{MAX_BUDGET_JOBS + 99:05d}" in budget
    batch = decode(encode(Batch(ts=now, frames=[], budget=budget)), max_bytes=16 << 20)
    assert isinstance(batch, Batch) and batch.budget is not None and batch.budget_error is None


# -- recordings: inflated frames ----------------------------------------------------------


def test_a_recording_that_inflates_to_gigabytes_is_read_in_bounded_memory(
        tmp_path: Path) -> None:
    """Frames of 16 MiB of zeros compress to almost nothing: before, every frame was
    inflated and held before the app started. Now a frame larger than a node's frame may
    be stops the reading there, with the reason, and memory stays small."""
    from tuimon.sources.recording import read_recording

    path = tmp_path / "bomb.tmr"
    with gzip.open(path, "wb") as fh:
        fh.write(msgpack.packb({"tuimon_recording": 1, "started": 1.0, "name": "bomb"}))
        for i in range(4):
            fh.write(msgpack.packb([float(i), "a:1", encode_map(
                {"v": 1, "t": "sample", "seq": i, "ts": 1.0, "interval": 1.0})],
                use_bin_type=True))
        zeros = bytes(16 << 20)
        for i in range(8):
            fh.write(msgpack.packb([10.0 + i, "a:1", zeros], use_bin_type=True))
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        rec = read_recording(path)
        frames = list(rec.frames())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rec.count == 4 and len(frames) == 4
    assert rec.damage is not None and "stops after 4 frames" in rec.damage
    assert peak < 8 << 20, peak


# -- Prometheus answers -----------------------------------------------------------------------


async def _prom_server(answers: list[bytes]) -> tuple[web.AppRunner, str]:
    """A loopback HTTP server answering each query with the next of `answers` (the last
    repeats), as Prometheus's /api/v1/query would be read."""
    served = [0]

    async def query(request: web.Request) -> web.StreamResponse:
        body = answers[min(served[0], len(answers) - 1)]
        served[0] += 1
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for i in range(0, len(body), 1 << 20):  # chunked: no length said in advance
            await resp.write(body[i:i + (1 << 20)])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    app.router.add_get("/api/v1/targets", query)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


@pytest.mark.parametrize(("body", "reason"), [
    (b"[" * 100_000 + b"]" * 100_000, "not a JSON answer"),
    (b'{"status":"success","data":[1,2]}', None),  # the wrong shape: no series, no crash
    (b'{"status":"success","data":{"resultType":"vector","result":[{"metric":5,'
     b'"value":"x"}]}}', None),
    (b"<html>proxy error</html>", "not a JSON answer"),
    (b'{"status":"success","warnings":' + b"[" * 100_000 + b"]" * 100_000
     + b',"data":{"resultType":"vector","result":[]}}', "not a JSON answer"),
])
async def test_malformed_prometheus_answers_are_a_reason_not_a_traceback(
        body: bytes, reason: str | None) -> None:
    from tuimon.sources.prometheus import PromError, PromSource

    runner, url = await _prom_server([body])
    try:
        async with aiohttp.ClientSession() as session:
            source = PromSource(url, ClusterState(), session)
            if reason is None:
                await source.refresh()
            else:
                with pytest.raises(PromError, match=reason):
                    await source.refresh()
    finally:
        await runner.cleanup()


async def test_a_prometheus_answer_over_the_bound_is_refused_in_bounded_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer larger than MAX_ANSWER_BYTES (a quarter of a gigabyte took 11 GB to
    parse) is read no further than the bound: the refresh fails with the reason."""
    from tuimon.sources import prom_client, prometheus

    monkeypatch.setattr(prom_client, "MAX_ANSWER_BYTES", 2 << 20)
    big = b'{"status":"success","data":{"resultType":"vector","result":[' + b" " * (
        6 << 20) + b"]}}"
    runner, url = await _prom_server([big])
    try:
        async with aiohttp.ClientSession() as session:
            source = prometheus.PromSource(url, ClusterState(), session)
            with pytest.raises(prometheus.PromError, match="an answer over 2 MiB"):
                await source.refresh()
    finally:
        await runner.cleanup()


async def test_the_apps_prometheus_refreshes_go_on_after_a_bad_answer() -> None:
    """Before, a malformed answer ended the refresh task after one refresh, with no
    reason on screen. Now every node says why, and the next good answer brings them
    back."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    good = (b'{"status":"success","data":{"resultType":"vector","result":['
            b'{"metric":{"__name__":"DCGM_FI_DEV_GPU_TEMP","gpu":"0","Hostname":"n1"},'
            b'"value":[1,"50"]}]}}')
    bad = b"[" * 50_000
    answers = [good] * 40 + [bad] * 40 + [good]
    runner, url = await _prom_server(answers)
    cluster = ClusterState()
    try:
        async with aiohttp.ClientSession() as session:
            source = PromSource(url, cluster, session, PromOptions(every=0.2))
            task = asyncio.create_task(source.run())
            try:
                await _until(lambda: any(n.status == "up" for n in cluster.nodes.values()),
                             "the node from the first answer")
                await _until(lambda: any("not a JSON answer" in (n.reason or "")
                                         for n in cluster.nodes.values()), "the reason")
                await _until(lambda: all(n.status == "up" for n in cluster.nodes.values()),
                             "back with the next good answer")
                assert not task.done()
            finally:
                task.cancel()
    finally:
        await runner.cleanup()


def test_the_prometheus_token_is_never_sent_in_clear_off_loopback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tuimon.cli import main

    token = tmp_path / "token"
    token.write_text("s3cret-token-of-enough-length\n")
    token.chmod(0o600)
    code = main(["prom", "http://prometheus.example:9090", "--token-file", str(token),
                 "--once"])
    err = capsys.readouterr().err
    assert code == 2 and "refusing to send the token over plain HTTP" in err
    assert "an https:// URL" in err and "s3cret" not in err


# -- small inputs that used to raise ------------------------------------------------------


@pytest.mark.parametrize(("hosts", "reason"), [
    ("n[3-1]", "runs backwards"),
    ("n[1-" + "9" * 5000 + "]", "more than 12 digits"),
])
def test_odd_host_lists_are_a_usage_error(hosts: str, reason: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from tuimon.cli import main

    assert main(["status", hosts]) == 3  # status: a usage error is UNKNOWN
    assert reason in capsys.readouterr().err


def test_config_files_with_infinite_windows_or_deep_nesting_are_refused(
        tmp_path: Path) -> None:
    from tuimon.config import ConfigFileError, load

    inf = tmp_path / "inf.toml"
    inf.write_text('[clusters.a]\ntargets = ["n1"]\nslo_hours = inf\n')
    with pytest.raises(ConfigFileError, match="slo_hours: must be a positive number"):
        load(inf)
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigFileError, match="nested deeper"):
        load(deep)


async def test_a_broken_theme_file_is_reported_and_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A theme whose colour cannot be drawn, and one nested 5,000 deep: both named at
    start, the others load, and the app starts (and cycles themes) on the rest."""
    from tuimon.ui.app import TuimonApp
    from tuimon.ui.theme_files import REQUIRED_VARIABLES, load_themes

    themes = tmp_path / "tuimon" / "themes"
    themes.mkdir(parents=True)
    variables = "\n".join(f'"{v}" = "#102030"' for v in REQUIRED_VARIABLES)
    (themes / "bad-colour.toml").write_text(
        f'name = "bad"\nprimary = "not-a-colour"\n[variables]\n{variables}\n')
    (themes / "deep.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    loaded, problems = load_themes()
    assert "bad" not in [t.name for t in loaded] and len(loaded) >= 5
    assert any("bad-colour.toml: primary" in p for p in problems)
    assert any("deep.toml" in p and "nested deeper" in p for p in problems)
    app = TuimonApp(ClusterState(), sources=lambda state: [], theme="bad")
    async with app.run_test(size=(120, 30)) as pilot:
        for _ in range(len(app.theme_names) + 1):
            await pilot.press("t")
        assert app.is_running


def _hosts_answer(hosts: int, per_host: int = 1, name: str = "DCGM_FI_DEV_GPU_TEMP") -> bytes:
    """An answer of dcgm-exporter-like series naming `hosts` hosts, made as bytes."""
    parts = [(b'{"metric":{"__name__":"%s","gpu":"%d","UUID":"GPU-%08x","modelName":"NVIDIA '
              b'H100 80GB HBM3","Hostname":"host%06d","instance":"host%06d:9400",'
              b'"job":"dcgm"},"value":[1,"50"]}') % (name.encode(), g, i * per_host + g, i, i)
             for i in range(hosts) for g in range(per_host)]
    return (b'{"status":"success","data":{"resultType":"vector","result":['
            + b",".join(parts) + b"]}}")


async def test_prometheus_naming_more_nodes_than_shown_is_a_finding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer naming 300 hosts where 200 are shown: the first 200 are nodes, the rest
    left out, and a finding says how many, whose number falls back when they go."""
    from tuimon.model.diagnosis import Diagnosis
    from tuimon.model.efficiency import EfficiencyView
    from tuimon.model.storage import StorageView
    from tuimon.sources import prom_assembly, prometheus

    monkeypatch.setattr(prom_assembly, "MAX_NODES", 200)
    answers = {"many": _hosts_answer(300), "few": _hosts_answer(100)}
    which = ["many"]

    async def query(request: web.Request) -> web.Response:
        body = answers[which[0]] if "GPU_TEMP" in request.query.get("query", "") else EMPTY
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        cluster = ClusterState()
        async with aiohttp.ClientSession() as session:
            source = prometheus.PromSource(url, cluster, session)
            await source.refresh()
            assert len(cluster.nodes) == 200 and source.nodes_over == 100
            found = Diagnosis().update(cluster, EfficiencyView(), StorageView())
            [limit] = [f for f in found if f.kind == "source_limit"]
            assert "more nodes than the 200 shown (100 left out" in limit.message
            which[0] = "few"
            await source.refresh()
            assert source.nodes_over == 0 and cluster.source_limits == {}
    finally:
        await runner.cleanup()


async def test_prometheus_answers_of_a_hundred_thousand_hosts_in_bounded_memory(
        tmp_path: Path) -> None:
    """`tuimon prom` against a server whose every answer is 100 MiB, or 30 MiB naming
    100k hosts (110k series): the first refused as too large, the second for naming too
    many series together; the app's peak RSS stays within 512 MiB over several refreshes
    (four, one every 2 s; it took 4.8 GB in 10 s), and it says why on every refresh."""
    import subprocess
    import sys

    big = _hosts_answer(100_000, 8)[: 100 << 20]  # its size is what is refused
    many = _hosts_answer(110_000)
    root = Path(__file__).resolve().parent.parent
    for body, why in ((big, "an answer over 32 MiB"), (many, "series together")):
        runner, url = await _prom_server([body])
        try:
            # The app's loop (--plain) for 9 s, in a child of its own: its peak RSS alone.
            probe = (
                "import resource, subprocess, sys\n"
                "try:\n"
                "    p = subprocess.run(sys.argv[1:], capture_output=True, text=True, "
                "timeout=9)\n"
                "    out = p.stdout + p.stderr\n"
                "except subprocess.TimeoutExpired as e:\n"
                "    out = (e.stdout or b'').decode() + (e.stderr or b'').decode()\n"
                "print(out[-3000:])\n"
                "print('MAXRSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
            out = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-c", probe, sys.executable, "-m",
                                 "tuimon.cli", "prom", url, "--plain", "--every", "2"],
                capture_output=True,
                text=True, timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
        finally:
            await runner.cleanup()
        assert why in out.stdout, out.stdout[-2000:]
        rss_mib = int(out.stdout.rsplit("MAXRSS", 1)[1]) / 1024
        assert rss_mib < 512, (why, rss_mib)


def test_a_node_naming_new_ports_every_second_holds_a_bounded_book() -> None:
    """A node whose findings name 256 new ports each second: each would be held a
    minute after it goes (its hysteresis); the book keeps at most MAX_PER_NODE of one
    node, and another node's findings still come through."""
    from tuimon_core.findings import MAX_PER_NODE, Finding, FindingBook

    book = FindingBook()
    held: list[Finding] = []
    for second in range(60):
        conditions = [Finding("warning", "symbol_errors", "x", node="evil",
                              port=f"p{second}-{i}") for i in range(256)]
        conditions.append(Finding("critical", "xid", "honest XID 79", node="honest", gpu=0))
        held = book.update(conditions, float(second))
    evil = [f for f in held if f.node == "evil"]
    assert len(evil) <= MAX_PER_NODE and book.refused > 0
    assert any(f.node == "honest" for f in held)


@pytest.mark.parametrize("recorded", [False, True])
async def test_too_many_series_says_what_is_left_to_narrow_them(
        monkeypatch: pytest.MonkeyPatch, recorded: bool) -> None:
    """Past the series bound the refusal says how to narrow: --match, and --recorded
    only to a source not reading records already (it advised it to one that was)."""
    import aiohttp

    from tuimon.sources import prom_client

    monkeypatch.setattr(prom_client, "MAX_HELD_SERIES", 150)
    runner, url = await _prom_server([_hosts_answer(100)])
    try:
        async with aiohttp.ClientSession() as session:
            client = prom_client.PromClient(url, session, recorded=recorded)
            await client.query("up", "first")
            with pytest.raises(prom_client.PromError) as refused:
                await client.query("up", "second")
    finally:
        await runner.cleanup()
    text = str(refused.value)
    assert "series together" in text and "--match" in text
    assert ("--recorded" in text) is not recorded
