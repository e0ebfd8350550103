"""tuimon on data it did not write: real exporter scrapes and kernel files published by
other projects (tests/fixtures/real/README.md says where each comes from), through the
agent's parsers, Debian's node_exporter and a real Prometheus.

The Prometheus part serves each dcgm-exporter capture as a target of its own on a
loopback address of its own (127.0.0.x), beside a real node_exporter reading a /sys and
/proc tree built from real files, and checks what `tuimon prom` makes of them: one node
per machine, MIG GPUs whole, failed scrapes named, no phantom nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agent.collectors.storage import StorageCollector, StorageConfig
from agent.collectors.storage_parsers import parse_llite_stats, parse_mountstats
from agent.files import FileTree
from tests.peers import PROMETHEUS, free_port, running_prometheus
from tests.seeded import judged
from tests.trees import unttar, write
from tuimon.model.cluster import ClusterState
from tuimon.model.map_kinds import FABRIC_MAP, GPU_MAP
from tuimon.model.storage import StorageView
from tuimon.readout import render
from tuimon.sources.prometheus import PromOptions, PromSource
from tuimon_core.protocol import Sample, decode, encode
from tuimon_core.protocol.fields import FS_COLUMNS
from tuimon_core.protocol.overview_layout import busy_percents as busy_values

REAL = Path(__file__).resolve().parent / "fixtures" / "real"
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
MIB = 1 << 20


def real(name: str) -> str:
    return (REAL / name).read_text()


# -- the agent's parsers on real files -----------------------------------------------------


def test_real_mountstats_direct_io_counts_and_nfs4_stays_nfs4() -> None:
    mounts = {m.mountpoint: m for m in parse_mountstats(real("mountstats_nfs3_direct_nfs4.txt"))}
    a, b = mounts["/A"], mounts["/B"]
    # bytes: normal read, normal write, O_DIRECT read, O_DIRECT write, ...
    assert a.read_bytes == 204440464584 + 783170354688
    assert a.write_bytes == 110857586443 + 296174954496
    assert (a.fstype, b.fstype) == ("nfs", "nfs4")
    assert b.read_bytes == 1612840960 and b.ops["READ"].ops == 9797


def test_real_llite_stats_old_and_new_formats() -> None:
    old = parse_llite_stats(real("lustre_2.10_llite_stats.txt"))
    assert old.write_bytes == 93813797294080 and old.read_bytes == 4194304
    block = real("lustre_2.14_llite_stats.txt").split("llite.ai400x2-ff47bce9ca35d800.stats=")[1]
    new = parse_llite_stats(block)
    # Lustre prints only the counters that counted: no read_bytes line is 0 bytes read.
    assert new.read_bytes == 0 and new.write_bytes == 0
    assert new.ops["open"] == 35955554 and new.metadata_ops > 0


def test_lustre_mounted_three_times_and_a_subdirectory_counts_once(tmp_path: Path) -> None:
    """The real mount table with one file system mounted three times, plus a subdirectory
    mount of it: one entry, every llite instance's traffic summed, rates from the sums."""
    root = tmp_path / "root"
    stats = real("lustre_2.10_llite_stats.txt")
    mtab = real("mtab_lustre_triple_mount.txt") + \
        "10.0.2.15@tcp:/lustre/projects /projects lustre rw,flock 0 0\n"
    write(root / "proc/self/mounts", mtab)
    instances = ["lustre-ffff88105db50000", "lustre-ffff88105db51000",
                 "lustre-ffff88105db52000", "lustre-ff47bce9ca35d800"]

    def lay(extra: int) -> None:
        for n, inst in enumerate(instances):
            text = stats.replace("93813797294080", str(93813797294080 + n * 10**9 + extra))
            write(root / f"sys/kernel/debug/lustre/llite/{inst}/stats", text)
    lay(0)
    collector = StorageCollector(FileTree(root), StorageConfig(mmpmon=None,
                                                               statvfs_inline=True))
    collector.collect(0.0)
    lay(4 * 10**9)  # each instance wrote 4 GB in that second
    out, _ = collector.collect(1.0)
    lustre = [f for f in out["filesystems"] if f["fstype"] == "lustre"]
    assert len(lustre) == 1, lustre
    fs = lustre[0]
    assert fs["id"] == "/projects"  # the shortest mount point names it
    assert sorted(fs["mounts"]) == ["/mnt/lustre", "/projects",
                                    "/var/lib/lhsmd/roots/lhsm-plugin-posix",
                                    "/var/lib/lhsmd/roots/lhsm-plugin-s3"]
    assert fs["instances"] == 4
    assert fs["write_bytes_s"] == pytest.approx(4 * 4e9)
    assert collector.fs_totals["/projects"]["write_bytes"] == sum(
        93813797294080 + n * 10**9 + 4 * 10**9 for n in range(4))


def test_gpfs_mounted_without_mmpmon_says_why(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write(root / "proc/self/mounts", "gpfs0 /gpfs/fs0 gpfs rw,relatime 0 0\n")
    collector = StorageCollector(FileTree(root), StorageConfig(
        mmpmon=str(tmp_path / "no-mmpmon"), statvfs_inline=True))
    out, _ = collector.collect(0.0)
    (fs,) = out["filesystems"]
    assert fs["fstype"] == "gpfs" and "mmpmon" in fs["error"] and "--mmpmon" in fs["error"]


def test_once_exits_0_on_a_node_with_fabric_and_storage_but_no_gpu(tmp_path: Path) -> None:
    import sys

    root = tmp_path / "root"
    unttar(real("sysfs_infiniband_mlx5_0.ttar"), root)  # a node with an HCA, no /proc
    proc = subprocess.run([sys.executable, "-m", "agent", "once", "--json", "--root",
                           str(root), "--interval", "0.1"], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parent.parent,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["sample"]["fabric"]["ports"][0]["id"] == "mlx5_0:1"
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "agent", "once", "--root", str(empty),
                           "--interval", "0.1"], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parent.parent,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # nothing of the node was read


# -- through a real Prometheus -------------------------------------------------------------

need_peers = pytest.mark.skipif(
    (PROMETHEUS is None or NODE_EXPORTER is None) and os.environ.get("CI") != "true",
    reason="Prometheus or node_exporter not installed (CI installs both)")


def _without_family(text: str, name: str) -> str:
    return "\n".join(line for line in text.split("\n") if name not in line) + "\n"


@contextlib.asynccontextmanager
async def static_exporter(host: str, text: str) -> AsyncIterator[str]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=text.encode(), content_type="text/plain",
                            charset="utf-8")
    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port(host)
    await web.TCPSite(runner, host, port).start()
    try:
        yield f"{host}:{port}"
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def node_exporter_on(root: Path, host: str) -> Iterator[str]:
    assert NODE_EXPORTER is not None, "CI must install prometheus-node-exporter"
    port = free_port(host)
    proc = subprocess.Popen(
        [NODE_EXPORTER, f"--path.sysfs={root / 'sys'}", f"--path.procfs={root / 'proc'}",
         f"--path.rootfs={root / 'rootfs'}", "--collector.disable-defaults",
         "--collector.infiniband", "--collector.mountstats", "--collector.filesystem",
         "--collector.uname", f"--web.listen-address={host}:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"{host}:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def prometheus_scraping(tmp: Path, jobs: list[tuple[str, str, dict[str, str]]],
                        rules: str = "") -> contextlib.AbstractContextManager[str]:
    """A real Prometheus scraping each (job, target, extra labels) every second, with
    this rule file where given."""
    configs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: [{json.dumps(target)}]\n"
        + (f"        labels: {json.dumps(labels)}\n" if labels else "")
        for job, target, labels in jobs)
    return running_prometheus(tmp, configs, rules=rules)


async def _until(url: str, promql: str, count: int, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(f"{url}/api/v1/query", params={"query": promql}) as r:
                body = await r.json()
            if len(body["data"]["result"]) >= count:
                return
            assert time.monotonic() < deadline, f"no {count} series of {promql}: {body}"
            await asyncio.sleep(0.5)


def _gpu_node_tree(tmp: Path) -> tuple[Path, threading.Event]:
    """The IB and NFS side of a GPU node, from real files: an mlx5 HCA's sysfs, two NFS
    mounts' mountstats (O_DIRECT reads growing 4 GB/s on /A) and their mount table."""
    root = tmp / "node"
    unttar(real("sysfs_infiniband_mlx5_0.ttar"), root)
    write(root / "proc/1/mounts", "1.2.3.4:/storage/NFS /A nfs rw,vers=3 0 0\n"
                                  "2.2.2.2:/nfsdata/ /B nfs4 rw,vers=4 0 0\n")
    (root / "proc/10").mkdir(parents=True)
    (root / "proc/self").symlink_to("10")
    # node_exporter's mountstats collector reads mountinfo too (format as in its fixture).
    write(root / "proc/10/mountinfo",
          "1 1 0:5 / /A rw,nosuid,nodev,noexec,relatime shared:8 - nfs 1.2.3.4:/storage/NFS "
          "rw,vers=3,addr=1.2.3.4\n"
          "16 21 0:16 / /B rw,nosuid,nodev,noexec,relatime shared:7 - nfs4 2.2.2.2:/nfsdata/ "
          "rw,vers=4.0,addr=2.2.2.2\n")
    for mp in ("A", "B"):
        (root / "rootfs" / mp).mkdir(parents=True)
    text = real("mountstats_nfs3_direct_nfs4.txt")
    stop = threading.Event()

    def grow() -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            direct = 783170354688 + int((time.monotonic() - t0) * 4e9)
            tmp_file = root / "proc/10/.mountstats"
            tmp_file.write_text(text.replace("783170354688", str(direct)))
            tmp_file.replace(root / "proc/10/mountstats")
            stop.wait(0.25)
    threading.Thread(target=grow, daemon=True).start()
    return root, stop


@contextlib.asynccontextmanager
async def real_scrapes_in_prometheus(tmp: Path) -> AsyncIterator[tuple[str, str, str]]:
    """A real Prometheus scraping the real dcgm-exporter captures (each a target of its
    own) and a real node_exporter on a /sys tree of real files, once every target has
    been scraped: (its URL, this host's name (the L4's Hostname, node_exporter's
    uname), the broken capture's address)."""
    here = os.uname().nodename  # node_exporter's node_uname_info{nodename}
    kops = real("dcgm_v4_l4_kops.prom").replace('Hostname="i-030791dc5a37cd257"',
                                                f'Hostname="{here}"')
    a800 = real("dcgm_v3_a800_mig_2g20gb.prom")
    a800_clean = _without_family(a800, "DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION")
    tree, stop = _gpu_node_tree(tmp)
    try:
        async with contextlib.AsyncExitStack() as stack:
            serve = stack.enter_async_context
            # One machine: dcgm-exporter and node_exporter side by side on 127.0.0.2.
            dcgm_here = await serve(static_exporter("127.0.0.2", kops))
            nodex = stack.enter_context(node_exporter_on(tree, "127.0.0.2"))
            mig = await serve(static_exporter("127.0.0.3", a800_clean))
            broken = await serve(static_exporter("127.0.0.4", a800))
            lower = await serve(static_exporter(
                "127.0.0.5", real("dcgm_v4_lowercase_hostname_mig.prom")))
            container = await serve(static_exporter(
                "127.0.0.6", real("dcgm_v2v3_t4_containerid.prom")))
            selfonly = await serve(static_exporter(
                "127.0.0.7", "# TYPE go_goroutines gauge\ngo_goroutines 12\n"
                             "DCGM_FI_DEV_FAN_SPEED 0\n"))
            linode = await serve(static_exporter("127.0.0.8", real("dcgm_v4_k8s_linode.prom")))
            podname = await serve(static_exporter("127.0.0.9",
                                                  real("dcgm_v2_a30_mig_podname.prom")))
            jobs = [("dcgm", dcgm_here, {}), ("node", nodex, {}), ("dcgm-mig", mig, {}),
                    ("dcgm-broken", broken, {}),
                    # A pod-network exporter joined by Kubernetes relabelling's label.
                    ("dcgm-k8s", lower, {"kubernetes_node": "gpu-k8s-07"}),
                    ("dcgm-docker", container, {}), ("self", selfonly, {}),
                    ("dcgm-lke", linode, {}), ("dcgm-v2", podname, {})]
            url = stack.enter_context(prometheus_scraping(tmp, jobs))
            await _until(url, "up == 1", 8)
            await _until(url, "up{job='dcgm-broken'} == 0", 1)
            await _until(url, "rate(node_mountstats_nfs_direct_read_bytes_total[1m]) > 0", 1)
            await _until(url, "node_filesystem_size_bytes", 2)
            yield url, here, broken
    finally:
        stop.set()


# The nodes whose screen the test opens, for their every value (the detail query).
DETAIL = ("msxf-hpc-64-35-ai", "127.0.0.9")


@need_peers
async def test_real_exporters_through_a_real_prometheus(tmp_path: Path) -> None:
    async with real_scrapes_in_prometheus(tmp_path) as (url, here, broken):
        cluster = ClusterState()
        async with aiohttp.ClientSession() as session:
            source = PromSource(url, cluster, session, PromOptions(every=1.0))
            await source.refresh()
            # What only a node's screen shows comes while it is open.
            assert cluster.nodes[here].sample.gpus[0].get("pcie_tx") is None
            cluster.set_detail({here, *DETAIL})
            await source.refresh()

    names = set(cluster.nodes)
    # One machine, one node: the GPUs (dcgm, Hostname) and the IB port and NFS mounts
    # (node_exporter, instance 127.0.0.2 whose uname is this host) together.
    node = cluster.nodes[here]
    assert "127.0.0.2" not in names, names
    assert node.gpu_count == 1 and node.hello.gpus[0].name == "NVIDIA L4"
    g = node.sample.gpus[0]
    assert g["mem_reserved"] > 0 and g["mem_total"] >= g["mem_used"] + g["mem_reserved"]
    assert g.get("gr_active") is not None and g.get("pcie_tx") is not None
    ports = node.sample.extra["fabric"]["ports"]
    assert [p["id"] for p in ports] == ["mlx5_0:1"]
    assert ports[0]["state_name"] == "ACTIVE"  # only the others are asked: it is ACTIVE
    fs = {f["id"]: f for f in node.sample.extra["storage"]["filesystems"]}
    assert fs["/A"]["fstype"] == "nfs" and fs["/B"]["fstype"] == "nfs4"
    assert 2e9 < fs["/A"]["read_bytes_s"] < 8e9  # O_DIRECT reads counted, by mount point
    assert fs["/A"]["size"] > 0
    # The overview the viewer builds from these real scrapes (no agent made one): a
    # level per GPU and port for every metric, as a map reads them, busy from DCGM's
    # engine activity, the NFS mounts shared.
    ov = node.overview
    assert ov is not None
    for kind in (GPU_MAP, FABRIC_MAP):
        assert [len(kind.levels(node, m)) for m in kind.metrics] == [1] * len(kind.metrics)
    assert GPU_MAP.levels(node, GPU_MAP.metrics[0]) == [
        GPU_MAP.metrics[0].level({"gr_active": node.sample.gpus[0]["gr_active"]})]
    assert busy_values(ov["busy"]) == bytes([round(g["gr_active"] * 100)])
    # The ports are the hello's, so the overview leaves them out and the node has them.
    assert "ports" not in ov and node.port_ids == ["mlx5_0:1"]
    assert {r[0] for r in ov["fs_rows"]} >= {"/A", "/B"}
    assert ov_read(ov, "/A") == round(fs["/A"]["read_bytes_s"])
    # Sent as an agent sends it, that overview passes the viewer's checks (a file system
    # of known keys takes their fast path) unchanged, and storage names its reader.
    wire = decode(encode(Sample(1, 1.0, 1.0, extra={"overview": ov})))
    assert isinstance(wire, Sample) and wire.extra["overview"] == ov
    storage = StorageView()
    storage.update(cluster)
    assert storage.filesystems["/A"].top_readers[0] == (node.name, ov_read(ov, "/A"))

    # MIG: the A800's GPU 0 is three 2g.20gb instances; memory summed, power once.
    a = cluster.nodes["msxf-hpc-64-35-ai"]
    gpus = dict(zip((i.index for i in a.hello.gpus), a.sample.gpus))
    g0 = gpus[0]
    assert g0["mig_mode"] == 1 and [m["gi"] for m in g0["mig"]] == [3, 5, 6]
    assert {m["profile"] for m in g0["mig"]} == {"2g.20gb"}
    assert g0["mem_total"] == 3 * (10 + 19957) * MIB and g0["mem_used"] == 30 * MIB
    assert g0["power"] == pytest.approx(78.446)
    assert g0["gr_active"] == 0.0 and g0.get("util") is None
    assert gpus[1]["util"] is not None and "mig" not in gpus[1]
    assert gpus[1]["pcie_tx"] is not None  # DCGM_FI_PROF_PCIE_TX_BYTES, bytes/s

    # The scrape Prometheus refused (ERROR values in the text) is named, with its reason.
    (failure,) = [f for key, f in cluster.scrape_failures.items() if key.startswith("dcgm-broken")]
    failed_node, reason = failure
    assert broken in reason and reason.startswith("scrape of dcgm-broken")
    assert "ERROR" in reason or "invalid" in reason or "expected" in reason, reason
    assert cluster.nodes[failed_node].status in ("stale", "down")
    _, findings = judged(cluster, seconds=0)
    assert any(f.kind == "scrape_failed" and broken in f.message for f in findings), findings
    # Their XID field is 0, dcgm-exporter's "no XID": no XID finding, and the readout's
    # xid column (which counts what the GPUs say, as that finding does) reads 0.
    assert not [f for f in findings if f.kind == "xid"], findings
    table = render(cluster).splitlines()
    column = next(line for line in table if line.startswith("node ")).split().index("xid")
    for name in ("msxf-hpc-64-35-ai", "lke529760-766837-0a634ab30000"):
        row = next(line for line in table if line.startswith(name + " "))
        assert row.split()[column] == "0", row

    # Kubernetes: lowercase `hostname` is the exporter pod; the relabelled node wins.
    k8s = cluster.nodes["gpu-k8s-07"]
    assert "dcgm-exporter-wwwjh" not in names
    assert any(g.get("mig_mode") == 1 for g in k8s.sample.gpus)
    # A Docker container id is not a node name; nor is a pod name (2.x, #68).
    assert "424773df46e0" not in names and "127.0.0.6" in names
    assert "dcgm-exporter-sn5rp" not in names
    v2 = cluster.nodes["127.0.0.9"].sample.gpus[0]
    assert v2["mig"][0]["profile"] == "2g.12gb" and v2["tensor_active"] is not None
    assert "lke529760-766837-0a634ab30000" in names
    # No phantom node from a target that has no GPU, host or port series.
    assert "127.0.0.7" not in names


def ov_read(overview: dict[str, object], mount: str) -> object:
    rows: list[list[object]] = overview["fs_rows"]  # type: ignore[assignment]
    return next(r[FS_COLUMNS.index("read")] for r in rows if r[0] == mount)


def test_node_identity_order() -> None:
    from tuimon.sources.prom_nodes import NodeNames

    names = NodeNames(["cluster_node"], aliases={"old-name": "gpu009"})
    names.learn_uname([({"instance": "10.0.0.5:9100", "nodename": "gpu005"}, 1.0)])
    of = names.of
    assert of({"cluster_node": "gpu001", "node": "x"}) == "gpu001"
    assert of({"kubernetes_node": "gpu002", "Hostname": "dcgm-exporter-abcde"}) == "gpu002"
    assert of({"Hostname": "gpu003", "instance": "10.0.0.9:9400"}) == "gpu003"
    assert of({"hostname": "gpu004"}) == "gpu004"  # dcgm-exporter after the rename
    # A pod or container is not the machine: the instance (and its uname) decides.
    assert of({"Hostname": "nvidia-dcgm-exporter-ml2wh", "instance": "10.0.0.5:9400"}) == \
        "gpu005"
    assert of({"Hostname": "424773df46e0", "instance": "10.0.0.5:9400"}) == "gpu005"
    assert of({"Hostname": "trainer-0", "pod": "trainer-0", "instance": "h:1"}) == "h"
    assert of({"instance": "10.0.0.5:9100"}) == "gpu005"
    assert of({"instance": "[fe80::1]:9100"}) == "fe80::1"
    assert of({"Hostname": "old-name"}) == "gpu009"
    assert NodeNames.short_forms(["gpu001.cluster.local", "gpu001", "10.0.0.1"]) == {
        "gpu001.cluster.local": "gpu001"}
