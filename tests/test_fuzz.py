"""Fuzzing every parser of outside input: each either returns a value of its documented
shape or raises its own documented error with a reason; nothing else escapes.

Inputs are random text, random bytes, and real-looking files with random damage
(characters replaced, lines cut, numbers blown up), which reach deeper than noise.
"""

from __future__ import annotations

import math
import re
import string
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.collectors.ethtool_stats import pause_summary
from agent.collectors.fabric import CounterError, parse_counter, parse_rate, parse_state
from agent.collectors.host import (
    ParseError,
    parse_loadavg,
    parse_meminfo,
    parse_proc_stat,
    parse_uptime,
)
from agent.collectors.storage_parsers import (
    FormatError,
    parse_diskstats,
    parse_llite_stats,
    parse_mmpmon_fs_io_s,
    parse_mounts,
    parse_mountstats,
)
from agent.steps import StepError, decode_step
from tests.trees import diskstats_line, llite_stats, mountstats_nfs
from tuimon.config import ConfigFileError, load
from tuimon.model.view_state import parse_topology_conf
from tuimon.sources.targets import TargetError, parse_targets
from tuimon_core.protocol import MAX_BATCH_BYTES, ProtocolError, decode

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

PROC_STAT = "cpu  4705 356 584 3699176 23060 0 877 0 0 0\ncpu0 1393 280 290 924325 1010 0 0\n"
MEMINFO = "MemTotal:       16311020 kB\nMemFree:         1190232 kB\nMemAvailable:    8420000 kB\n"
MMPMON = ("_fs_io_s_ _n_ 10.0.0.1 _nn_ node1 _rc_ 0 _t_ 1700000000 _tu_ 1 _cl_ gpfs1 "
          "_fs_ scratch _d_ 4 _br_ 205607400434 _bw_ 74839282351 _oc_ 10 _cc_ 9 _rdc_ 100 "
          "_wc_ 50 _dir_ 2 _iu_ 3\n")
MOUNTS = "/dev/sda1 / ext4 rw 0 0\nfs@o2ib:/scratch /lustre/scratch lustre rw 0 0\n"
TOPOLOGY = "SwitchName=leaf01 Nodes=gpu[001-016]\nSwitchName=spine Switches=leaf[01-02]\n"
CONFIG = ('[clusters.prod]\ntargets = ["gpu[001-004]:9477"]\nslo_target = 0.9\n'
          '[clusters.prod.provisioned]\n"/lustre" = 400\n')

SEEDS = {
    "stat": PROC_STAT, "meminfo": MEMINFO, "mmpmon": MMPMON, "mounts": MOUNTS,
    "topology": TOPOLOGY, "config": CONFIG, "loadavg": "0.52 0.58 0.59 2/1000 12345\n",
    "uptime": "12345.67 45678.90\n",
    "diskstats": diskstats_line(8, 0, "sda", reads=100, rsect=800)
    + diskstats_line(259, 0, "nvme0n1", reads=5, rsect=8),
    "llite": llite_stats(4194304, 10, 93813797294080, 20),
    "mountstats": mountstats_nfs("/mnt/nfs", 1000, 2000, 30, 40),
}


@st.composite
def damaged(draw: st.DrawFn, seed: str) -> str:
    """A real-looking file with random damage."""
    text = seed
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["replace", "cut", "number", "insert", "dup"]))
        pos = draw(st.integers(0, max(0, len(text) - 1)))
        if kind == "replace" and text:
            text = text[:pos] + draw(st.characters()) + text[pos + 1:]
        elif kind == "cut":
            text = text[:pos]
        elif kind == "number":
            number = draw(st.sampled_from(
                ["-1", "99999999999999999999999999", "nan", "inf", "1e400", "0x10", ""]))
            text = text[:pos] + number + text[pos:]
        elif kind == "insert":
            text = text[:pos] + draw(st.text(alphabet=string.printable, max_size=20)) \
                + text[pos:]
        else:
            text = text + text[pos:]
    return text


def inputs(seed: str) -> st.SearchStrategy[str]:
    return st.one_of(st.text(max_size=300), damaged(seed))


def _finite(x: float | None) -> bool:
    return x is None or math.isfinite(x)


@FUZZ
@given(inputs(PROC_STAT), inputs(MEMINFO), inputs(SEEDS["loadavg"]), inputs(SEEDS["uptime"]))
def test_host_parsers(stat: str, meminfo: str, loadavg: str, uptime: str) -> None:
    for fn, text in ((parse_proc_stat, stat), (parse_meminfo, meminfo),
                     (parse_loadavg, loadavg), (parse_uptime, uptime)):
        try:
            value = fn(text)
        except ParseError as exc:
            assert str(exc)
            continue
        if isinstance(value, dict):
            assert all(isinstance(v, int) and v >= 0 for v in value.values())
        elif isinstance(value, tuple):
            assert all(_finite(v) and v >= 0 for v in value)
        else:
            assert _finite(value) and value >= 0


@FUZZ
@given(st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode),
                 st.sampled_from([b"4: ACTIVE\n", b"N/A (no PMA)\n", b"18446744073709551615",
                                  b"400 Gb/sec (4X NDR)\n", b"-5", b"1e3"])))
def test_sysfs_value_parsers(raw: bytes) -> None:
    try:
        value = parse_counter(raw)
        assert isinstance(value, int) and value >= 0
    except CounterError as exc:
        assert str(exc)
    text = raw.decode("utf-8", "replace")
    number, name = parse_state(text)
    assert number is None or isinstance(number, int)
    assert isinstance(name, str)
    assert _finite(parse_rate(text))


_MLX5_NAMES = [f"{d}_{k}_pause{x}" for d in ("rx", "tx") for k in ("global", "prio3", "prio9")
               for x in ("", "_duration")] + [
    f"rx_prio{i}_{w}" for i in (0, 3, 7, 8) for w in ("packets", "discards")] + [
    "rx_discards_phy", "rx_packets_phy", "tx_pause_storm_error_events "]


@FUZZ
@given(st.dictionaries(st.one_of(st.sampled_from(_MLX5_NAMES), st.text(max_size=32)),
                       st.integers(0, 2**64 - 1), max_size=24))
def test_mlx5_pause_summary(stats: dict[str, int]) -> None:
    """Whatever names and u64 values a driver lists: a summary, each drop once, the
    lossless part of the drops never more than all of them."""
    summary = pause_summary(stats)
    assert all(isinstance(v, int) and v >= 0 for v in summary.totals.values())
    assert set(summary.pfc) <= set(range(8))
    totals = summary.totals
    assert totals.get("lossless_discards", 0) <= totals.get("discards", 0)
    # One family: the priorities' drops where any is listed, else the port's.
    named = {k.strip(): v for k, v in stats.items()}
    prio = [v for k, v in named.items() if re.fullmatch(r"rx_prio[0-7]_discards", k)]
    if prio:
        assert totals["discards"] == sum(prio)
    elif "rx_discards_phy" in named:
        assert totals["discards"] == named["rx_discards_phy"]


PCI_PATH = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0"


@FUZZ
@given(inputs(f"../../../{PCI_PATH}"), inputs("32.0 GT/s PCIe\n"), inputs("16\n"))
def test_pci_paths(target: str, speed: str, width: str) -> None:
    """Whatever a device's bus symlink and its links' files say, its path is None or
    links whose every value is None or in the wire's bounds."""
    from agent.collectors.pci import PciPaths
    from agent.files import GeneratedTree

    files = {"sys/bus/pci/devices/0000:19:00.0": lambda: target}
    parts = PCI_PATH.split("/")
    for depth in range(2, len(parts) + 1):
        base = "sys/" + "/".join(parts[:depth])
        for name, value in (("current_link_speed", speed), ("max_link_speed", speed),
                            ("current_link_width", width), ("max_link_width", width)):
            files[f"{base}/{name}"] = lambda value=value: value
    paths = PciPaths(GeneratedTree(files))
    hops = paths.read("0000:19:00.0", with_now=True)
    assert hops is None or 1 <= len(hops) <= 8
    now = paths.now("0000:19:00.0")
    for hop in hops or ():
        assert {hop["up_kind"]} <= {"root", "switch"}
        for key in ("up_gen_max", "down_gen_max", "gen", "up_width_max", "down_width_max",
                    "width"):
            assert hop[key] is None or 1 <= hop[key] <= 64, (key, hop)
    assert (now is None) == (hops is None)


@FUZZ
@given(inputs(SEEDS["llite"]), inputs(MMPMON), inputs(SEEDS["mountstats"]),
       inputs(SEEDS["diskstats"]), inputs(MOUNTS))
def test_storage_parsers(llite: str, mmpmon: str, mountstats: str, diskstats: str,
                         mounts: str) -> None:
    # A FormatError (with its reason) or sound values: counters are never negative.
    def parsed(fn, text):  # type: ignore[no-untyped-def]
        try:
            return fn(text)
        except FormatError as exc:
            assert str(exc)
            return None

    stats = parsed(parse_llite_stats, llite)
    assert stats is None or (stats.read_bytes >= 0 and stats.write_bytes >= 0)
    for fs in parsed(parse_mmpmon_fs_io_s, mmpmon) or []:
        assert isinstance(fs.filesystem, str) and fs.read_bytes >= 0 and fs.reads >= 0
    for mount in parsed(parse_mountstats, mountstats) or []:
        assert isinstance(mount.mountpoint, str) and mount.read_bytes >= 0
    for disk in parsed(parse_diskstats, diskstats) or []:
        assert disk.name and disk.reads >= 0
    for m in parsed(parse_mounts, mounts) or []:
        assert isinstance(m.mountpoint, str)


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.dictionaries(
    st.sampled_from(["v", "t", "job", "rank", "world", "seq", "ts", "wall", "compute",
                     "samples", "tokens", "pid", "local_rank"]),
    st.one_of(st.none(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=5)),
    max_size=13).map(lambda m: msgpack.packb(m))))
def test_step_datagrams(data: bytes) -> None:
    try:
        step = decode_step(data)
    except StepError as exc:
        assert str(exc)
        return
    assert 0 <= step["rank"] < step["world"]
    assert 0 <= step["compute"] <= step["wall"] <= 86400


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
              st.text(max_size=8), st.binary(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=30).map(lambda obj: msgpack.packb({"v": 1, "t": "batch", "frames": obj,
                                                   "ts": 1.0}))))
def test_batch_frames(data: bytes) -> None:
    """A relay's batch: anything malformed is a ProtocolError naming the part."""
    try:
        decode(data, max_bytes=MAX_BATCH_BYTES)
    except ProtocolError as exc:
        assert exc.reason


@FUZZ
@given(inputs(TOPOLOGY))
def test_topology_conf(text: str) -> None:
    try:
        topology = parse_topology_conf(text)
    except TargetError as exc:  # a host list Slurm would refuse too
        assert "host list" in str(exc)
        return
    for node, leaf in topology.items():
        assert isinstance(node, str) and isinstance(leaf, str)


@FUZZ
@given(st.lists(st.one_of(st.text(max_size=30),
                          st.sampled_from(["gpu[001-", "gpu[3-1]", "[::1]:9477", "a:0",
                                           "a:99999", "gpu[001-004]:9477", "x]:1"])),
                max_size=5))
def test_target_lists(items: list[str]) -> None:
    try:
        targets = parse_targets(items)
    except TargetError as exc:
        assert str(exc)
        return
    assert all(":" in t for t in targets)


@FUZZ
@given(inputs(CONFIG))
def test_config_loader(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path: Path = tmp_path_factory.mktemp("cfg") / "config.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        clusters = load(path)
    except ConfigFileError as exc:
        assert str(path) in str(exc)
        return
    for c in clusters.values():
        assert isinstance(c.targets, tuple) and all(isinstance(t, str) for t in c.targets)
        assert c.slo_target is None or 0 < c.slo_target < 1


@FUZZ
@given(st.text(max_size=60), st.integers(1, 80))
def test_safe_text_cannot_break_the_markup_around_it(text: str, width: int) -> None:
    """Whatever a node calls itself, the app's markup around it parses and shows it
    escaped, with nothing unprintable left."""
    from textual.markup import to_content

    from tuimon.text.markup import safe
    from tuimon_core.protocol.text import clean as printable

    shown = to_content(f"[b]node[/b] [red]{safe(text, width)}[/] [b]end[/b]").plain
    assert shown == f"node {printable(text)[:width]} end".replace("\\\u200b", "\\") or \
        shown.replace("\u200b", "") == f"node {printable(text)[:width]} end"
    assert all(c.isprintable() or c == "\u200b" for c in shown)


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.dictionaries(
    st.sampled_from(["v", "t", "seq", "ts", "interval", "gpus", "host", "fabric", "storage",
                     "steps", "dropped"]),
    st.one_of(st.none(), st.integers(-5, 5), st.floats(), st.text(max_size=5),
              st.lists(st.integers(-2**63, 2**63), max_size=3),
              st.dictionaries(st.text(max_size=3),
                              st.integers(-2**63, 2**63), max_size=3)),
    max_size=11).map(lambda m: msgpack.packb({"t": "sample", "v": 1, **m}))))
def test_relay_envelope_decode(data: bytes) -> None:
    """The relay's envelope-only decode refuses what the full decode refuses about the
    envelope and the steps, and agrees with it on what both accept."""
    try:
        quick = decode(data, deep=False)
    except ProtocolError as exc:
        assert exc.reason
        return
    try:
        full = decode(data)
    except ProtocolError:
        return  # a value inside a forwarded section: the viewer's to refuse
    assert type(quick) is type(full)
    if quick is not None and hasattr(quick, "seq"):
        assert (quick.seq, quick.ts, quick.interval, quick.extra.get("steps")) == (
            full.seq, full.ts, full.interval, full.extra.get("steps"))


# What msgpack can carry at all (a peer cannot send a larger integer).
_MSGPACK_INTS = st.integers(-(2**63), 2**64 - 1)
_OVERVIEW_PART = st.one_of(
    st.none(), st.integers(-300, 300), st.floats(), st.text(max_size=5),
    st.binary(max_size=70), st.lists(st.one_of(st.none(), st.integers(-3, 300), st.floats(),
                                                st.text(max_size=4)), max_size=70),
    st.dictionaries(st.sampled_from(["util", "mem", "temp", "id", "read", "\x1b"]),
                    st.one_of(st.binary(max_size=9), _MSGPACK_INTS, st.text(max_size=4)),
                    max_size=4),
    # level blobs: a count, then runs (often of levels, so the checks past the count run)
    st.builds(lambda k, cells: bytes([k]) + cells, st.integers(0, 12),
              st.one_of(st.binary(max_size=40),
                        st.lists(st.integers(0, 11), max_size=40).map(bytes))),
    # file-system rows
    st.lists(st.lists(st.one_of(st.none(), st.text(max_size=4), _MSGPACK_INTS, st.floats(),
                                st.booleans(), st.lists(_MSGPACK_INTS, max_size=2)),
                      min_size=5, max_size=9), max_size=3))


@FUZZ
@given(st.dictionaries(st.sampled_from(["gpu", "busy", "ports", "fabric", "wait", "fs",
                                        "gpu_levels", "fabric_levels", "fs_rows", "future"]),
                      _OVERVIEW_PART, max_size=8),
       st.lists(st.dictionaries(st.sampled_from(["severity", "kind", "message", "gpu",
                                                 "port", "fs", "score", "node"]),
                                st.one_of(st.sampled_from(["critical", "warning", "info"]),
                                          st.text(max_size=6), st.integers(-2, 70),
                                          st.floats(), st.none()), max_size=8),
                max_size=3),
       st.one_of(st.none(), st.lists(st.text(max_size=6), max_size=3), _MSGPACK_INTS))
def test_overview_findings_and_detail(overview: dict[str, object], findings: list[object],
                                      detail: object) -> None:
    """The overview and findings families, and a subscription's detail: each is refused
    with a reason naming it, or reads back as what views may index and colour with."""
    from tuimon_core.findings_family import findings_from_wire
    from tuimon_core.heat_levels import FAILED
    from tuimon_core.protocol.fields import FS_COLUMNS
    from tuimon_core.protocol.overview_layout import level_run, levels_of

    sample = msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                            "overview": overview, "findings": findings})
    for deep in (True, False):
        try:
            message = decode(sample, deep=deep)
        except ProtocolError as exc:
            assert "sample.overview" in exc.reason or "sample.findings" in exc.reason
            continue
        ov = message.extra.get("overview")  # type: ignore[union-attr]
        if ov is not None:
            # Whatever the form it came in, the views read the compact one.
            assert not ov.keys() & {"gpu", "fabric", "fs"}
            for section in ("gpu_levels", "fabric_levels"):
                blob = ov.get(section)
                for i in range(blob[0] if blob else 0):
                    run = level_run(blob, i)
                    assert run is not None
                    assert all(FAILED - 1 <= lv <= 8 for lv in levels_of(run))
            for row in ov.get("fs_rows") or []:
                fid, *values = row
                assert len(row) == len(FS_COLUMNS) and isinstance(fid, str)
                assert all(v is None or (isinstance(v, str) and v.isprintable()) or (
                    type(v) in (int, float) and math.isfinite(v)) for v in values)
        for f in findings_from_wire(message.extra["findings"], "n1"):  # type: ignore[union-attr]
            assert f.node == "n1" and f.message.isprintable()
    subscribe = msgpack.packb({"v": 1, "t": "subscribe", "detail": detail})
    try:
        sub = decode(subscribe)
    except ProtocolError as exc:
        assert "subscribe.detail" in exc.reason
        return
    assert sub.detail is None or all(isinstance(n, str) for n in sub.detail)  # type: ignore[union-attr]
