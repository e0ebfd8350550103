"""ethtool statistics over SIOCETHTOOL: the real ioctl against this machine's interfaces,
a scripted driver for what real NICs do between reads, and the mlx5 pause summary on real
ConnectX counters: a ConnectX-4 Lx with global pause and one with PFC on priority 0 (two
notes in public repositories), and two mlx5 dumps under an XDP flood from the bpf
mailing list (2024-06-19); the values only, sources in tests/fixtures/real/README.md."""

from __future__ import annotations

import array
import errno
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.collectors import ethtool_stats
from agent.collectors.ethtool_stats import (
    ETHTOOL_GSSET_INFO,
    ETHTOOL_GSTATS,
    ETHTOOL_GSTRINGS,
    PHY_DISCARDS,
    PRIO_DISCARDS,
    EthtoolError,
    EthtoolStats,
    PauseSummary,
    pause_summary,
)

SYS_NET = Path("/sys/class/net")
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="SIOCETHTOOL is Linux-only")


def interfaces_with_stats() -> list[tuple[str, dict[str, int]]]:
    """Every interface in /sys/class/net whose driver has statistics, eth0 first."""
    if not SYS_NET.is_dir():
        return []
    names = sorted(p.name for p in SYS_NET.iterdir())
    names.sort(key=lambda n: n != "eth0")
    found = []
    with EthtoolStats() as e:
        for name in names:
            try:
                stats = e.read(name)
            except EthtoolError:
                continue
            if stats:
                found.append((name, stats))
    return found


def first_interface_with_stats() -> tuple[str, dict[str, int]]:
    found = interfaces_with_stats()
    if not found:
        listed = sorted(p.name for p in SYS_NET.iterdir()) if SYS_NET.is_dir() else []
        pytest.skip(f"no interface in /sys/class/net has driver statistics (looked at {listed})")
    return found[0]


# --- the real ioctl ---------------------------------------------------------------------


@linux_only
def test_real_interface_names_and_values() -> None:
    ifname, _ = first_interface_with_stats()
    with EthtoolStats() as e:
        first = e.read(ifname)
        second = e.read(ifname)
    assert first, ifname
    assert list(first) == list(second)
    for stats in (first, second):
        for name, value in stats.items():
            assert name and name == name.strip() and "\0" not in name
            assert type(value) is int and 0 <= value < 2**64, (name, value)
    # A virtio, veth or ifb port carries no mlx5 lossless counters: nothing to summarise.
    if not any("pause" in n or "discard" in n for n in first):
        assert pause_summary(first) == PauseSummary({})


@linux_only
def test_real_interfaces_keep_their_own_names() -> None:
    found = interfaces_with_stats()
    if len(found) < 2:
        pytest.skip(f"needs two interfaces with driver statistics, found {[n for n, _ in found]}")
    (a, a_stats), (b, b_stats) = found[:2]
    with EthtoolStats() as e:
        assert list(e.read(a)) == list(a_stats)
        assert list(e.read(b)) == list(b_stats)
        assert list(e.read(a)) == list(a_stats)


@linux_only
def test_loopback_has_no_statistics() -> None:
    if not (SYS_NET / "lo").exists():
        pytest.skip("no lo in /sys/class/net")
    with EthtoolStats() as e, pytest.raises(EthtoolError) as info:
        e.read("lo")
    assert info.value.errno == errno.EOPNOTSUPP
    assert info.value.ifname == "lo"
    assert str(info.value).endswith("lo: EOPNOTSUPP: the driver has no statistics")
    assert isinstance(info.value, OSError)


@linux_only
def test_missing_interface_is_enodev() -> None:
    assert not (SYS_NET / "no-such-if0").exists()
    with EthtoolStats() as e, pytest.raises(EthtoolError) as info:
        e.read("no-such-if0")
    assert info.value.errno == errno.ENODEV
    assert "no-such-if0: ENODEV: no such interface" in str(info.value)


@pytest.mark.parametrize("bad", ["a/b", "x" * 20, "x" * 16, "", "eth0:1", "eth 0", "et\0h0",
                                 "..", "eth0\n"])
def test_invalid_names_refused_before_any_ioctl(bad: str, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    def no_ioctl(*args: object) -> None:
        raise AssertionError("ioctl issued for an invalid name")

    monkeypatch.setattr(ethtool_stats.fcntl, "ioctl", no_ioctl)
    e = EthtoolStats()
    with pytest.raises(EthtoolError) as info:
        e.read(bad)
    assert info.value.errno == errno.EINVAL
    assert info.value.ifname == bad
    assert "not an interface name" in str(info.value)
    assert e._sock is None  # not even a socket was opened


def test_fifteen_byte_name_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    def enodev(*args: object) -> None:
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(ethtool_stats.fcntl, "ioctl", enodev)
    with EthtoolStats() as e, pytest.raises(EthtoolError) as info:
        e.read("x" * 15)
    assert info.value.errno == errno.ENODEV  # reached the ioctl


@pytest.mark.parametrize("err", [errno.EPERM, errno.EACCES])
def test_permission_refusal_names_interface(err: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise PermissionError(err, "Operation not permitted")

    monkeypatch.setattr(ethtool_stats.fcntl, "ioctl", refuse)
    with EthtoolStats() as e, pytest.raises(EthtoolError) as info:
        e.read("eth7")
    assert info.value.errno == err
    assert "eth7: " in str(info.value) and "permission denied" in str(info.value)


@linux_only
def test_close_releases_socket_and_reopens() -> None:
    e = EthtoolStats()
    with pytest.raises(EthtoolError):
        e.read("no-such-if0")
    assert e._sock is not None
    e.close()
    assert e._sock is None
    e.close()  # twice is fine
    with pytest.raises(EthtoolError):
        e.read("no-such-if0")
    assert e._sock is not None
    e.close()


# --- a scripted driver: what the kernel answers, and what changes between calls -------


class ScriptedDriver:
    """Answers the three ethtool commands from `counters` the way the kernel does: GSTRINGS
    and GSTATS report and write the driver's current count, whatever was asked.
    `before[k]` runs before the k-th call (1-based) is answered."""

    def __init__(self, counters: dict[str, int]) -> None:
        self.counters = counters
        self.calls: list[int] = []
        self.before: dict[int, Callable[[], None]] = {}

    def __call__(self, ifname: str, raw_name: bytes, buf: array.array[int]) -> None:
        cmd = struct.unpack_from("=I", buf)[0]
        self.calls.append(cmd)
        if hook := self.before.get(len(self.calls)):
            hook()
        names = list(self.counters)
        if cmd == ETHTOOL_GSSET_INFO:
            struct.pack_into("=IIQI", buf, 0, cmd, 0, 1 << 1, len(names))
        elif cmd == ETHTOOL_GSTRINGS:
            assert len(buf) >= 12 + 32 * len(names), "the kernel would write past the buffer"
            struct.pack_into("=III", buf, 0, cmd, 1, len(names))
            for i, name in enumerate(names):
                struct.pack_into("32s", buf, 12 + 32 * i, name.encode())
        elif cmd == ETHTOOL_GSTATS:
            assert len(buf) >= 1 + len(names), "the kernel would write past the buffer"
            struct.pack_into("=II", buf, 0, cmd, len(names))
            for i, value in enumerate(self.counters.values()):
                buf[1 + i] = value
        else:
            raise AssertionError(f"unexpected ethtool command {cmd:#x}")


def scripted(monkeypatch: pytest.MonkeyPatch, counters: dict[str, int]) -> ScriptedDriver:
    driver = ScriptedDriver(counters)
    monkeypatch.setattr(EthtoolStats, "_ioctl", driver)
    return driver


def test_scripted_read_strips_names_and_keeps_u64(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, {"rx_packets_phy": 7, "tx_pause_storm_warning_events ": 2,
                           "rx_bytes_phy": 2**64 - 1})
    with EthtoolStats() as e:
        assert e.read("fake0") == {"rx_packets_phy": 7, "tx_pause_storm_warning_events": 2,
                                   "rx_bytes_phy": 2**64 - 1}


def test_names_decoded_once_while_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, {"a": 1, "b": 2})
    decoded: list[int] = []
    real = ethtool_stats._decode_names

    def counting(raw: bytes, count: int) -> tuple[str, ...]:
        decoded.append(count)
        return real(raw, count)

    monkeypatch.setattr(ethtool_stats, "_decode_names", counting)
    with EthtoolStats() as e:
        for _ in range(3):
            assert e.read("fake0") == {"a": 1, "b": 2}
    assert decoded == [2]


def test_names_reread_when_count_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = scripted(monkeypatch, {"rx_global_pause": 5, "tx_global_pause": 6})
    with EthtoolStats() as e:
        assert pause_summary(e.read("fake0")).totals == {"pause_rx": 5, "pause_tx": 6}
        driver.counters = {"rx_prio3_pause": 9, "tx_prio3_pause": 1,
                           "rx_prio4_pause": 2, "tx_prio4_pause": 3}
        assert e.read("fake0") == driver.counters


def test_same_count_new_names_not_mislabelled(monkeypatch: pytest.MonkeyPatch) -> None:
    # mlx5 moving from global pause to PFC on priority 3: same count, other names.
    driver = scripted(monkeypatch, {"rx_global_pause": 5, "rx_global_pause_duration": 50})
    with EthtoolStats() as e:
        assert pause_summary(e.read("fake0")).totals == {"pause_rx": 5, "pause_rx_us": 50}
        driver.counters = {"rx_prio3_pause": 8, "rx_prio3_pause_transition": 4}
        assert e.read("fake0") == {"rx_prio3_pause": 8, "rx_prio3_pause_transition": 4}


def test_count_change_mid_read_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = scripted(monkeypatch, {"a": 1, "b": 2})

    def grow() -> None:
        driver.counters = {"a": 1, "b": 2, "c": 3}

    driver.before[3] = grow  # between the names and the values of the first try
    with EthtoolStats() as e:
        assert e.read("fake0") == {"a": 1, "b": 2, "c": 3}
    assert driver.calls == [ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS, ETHTOOL_GSTATS] * 2


def test_count_growing_far_past_request_fits_headroom(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = scripted(monkeypatch, {"a": 1})

    def grow() -> None:
        driver.counters = {f"c{i}": i for i in range(200)}

    driver.before[2] = grow  # the kernel writes 200 names into a request for 1
    with EthtoolStats() as e:
        assert len(e.read("fake0")) == 200


def test_counter_set_that_never_settles_is_eagain(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = scripted(monkeypatch, {"a": 1})
    n = [1]

    def grow() -> None:
        n[0] += 1
        driver.counters = {f"c{i}": i for i in range(n[0])}

    for k in range(2, 20, 3):
        driver.before[k] = grow
    with EthtoolStats() as e, pytest.raises(EthtoolError) as info:
        e.read("fake0")
    assert info.value.errno == errno.EAGAIN and "fake0: EAGAIN" in str(info.value)


def test_zero_statistics_is_empty_without_gstrings(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = scripted(monkeypatch, {})
    with EthtoolStats() as e:
        assert e.read("fake0") == {}
    assert driver.calls == [ETHTOOL_GSSET_INFO]


# --- pause_summary on mlx5 counter text -----------------------------------------------

# ConnectX-4 Lx 25G, transcribed from a real machine's `ethtool -S` (grep excerpts in a
# notes file, "ethtool的统计", in a public repository: tests/fixtures/real/README.md). The
# space before one colon is the trailing space old mlx5 kernels put in that counter's name.
CX4LX = """\
     rx_prio0_discards: 0
     rx_prio1_discards: 0
     rx_discards_phy: 0
     tx_global_pause: 1266552
     tx_global_pause_duration: 555665182
     tx_pause_storm_warning_events : 0
     tx_pause_storm_error_events: 0
     tx_pci_signal_integrity: 3
"""


def parse_ethtool_s(text: str) -> dict[str, int]:
    """`ethtool -S` output -> name: value; names stripped, header lines skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.rpartition(":")
        if sep and value.strip().isdigit():
            out[name.strip()] = int(value)
    return out


def test_parser_strips_space_before_colon() -> None:
    stats = parse_ethtool_s("NIC statistics:\n" + CX4LX)
    assert "tx_pause_storm_warning_events" in stats
    assert len(stats) == 8


def test_summary_of_real_connectx4_lx() -> None:
    summary = pause_summary(parse_ethtool_s(CX4LX))
    assert summary.totals == {
        "pause_tx": 1266552,
        "pause_tx_us": 555665182,
        "pause_tx_us_global": 555665182,
        "storm_warning": 0,
        "storm_error": 0,
        "discards": 0,  # the per-priority counters: rx_discards_phy is not added to them
    }  # global pause on, sending only: no rx pause counters, so no pause_rx keys
    assert summary.global_pause and summary.pfc == ()  # global pause: no lossless class
    assert summary.drops_from == PRIO_DISCARDS


def test_summary_strips_names_itself() -> None:
    assert pause_summary({"tx_pause_storm_warning_events ": 4}).totals == {"storm_warning": 4}


# Two real `ethtool -S` dumps of one mlx5 port under an XDP_DROP flood, kernels 5.15 and
# 6.5 (Sebastiano Miano, "Re: XDP Performance Regression in recent kernel versions",
# bpf@vger.kernel.org, 2024-06-19, Message-ID
# <CAMENy5rwoP0o9Gn67a-27ZXtzM7dGhJOwA4i5znihiNThR27SQ@mail.gmail.com>): the counters the
# summary reads, as posted (the poster left zero counters out). Global pause only.
XDP_K515 = {"rx_packets_phy": 97052087562, "rx_discards_phy": 58591428329,
            "rx_prio0_packets": 38460533605, "rx_prio0_discards": 58591314012,
            "tx_pause_ctrl_phy": 5745055, "tx_global_pause": 5745042,
            "tx_global_pause_duration": 771103810, "rx_out_of_buffer": 990473555}
XDP_K65 = {"rx_packets_phy": 728277471186, "rx_discards_phy": 441063206498,
           "rx_prio0_packets": 287214264688, "rx_prio0_discards": 441063206498,
           "tx_pause_ctrl_phy": 44414017, "tx_global_pause": 44414017,
           "tx_global_pause_duration": 5961284324, "rx_out_of_buffer": 534918379}


@pytest.mark.parametrize("dump", [XDP_K515, XDP_K65], ids=["5.15", "6.5"])
def test_a_drop_is_counted_once_from_the_per_priority_counters(dump: dict[str, int]) -> None:
    """The port counter and the per-priority ones count the same drops (equal in the 6.5
    dump, within 0.0002 % in the 5.15 one): the summary takes the per-priority ones, not
    their sum with the port's, and what arrived is the port's packets, drops included
    (rx_prio0_packets + rx_prio0_discards = rx_packets_phy exactly in the 6.5 dump)."""
    summary = pause_summary(dump)
    assert summary.totals["discards"] == dump["rx_prio0_discards"]
    assert summary.drops_from == PRIO_DISCARDS
    assert summary.totals["arrived"] == dump["rx_prio0_packets"] + dump["rx_prio0_discards"]
    assert summary.totals["arrived"] == pytest.approx(dump["rx_packets_phy"], rel=1e-5)
    # No PFC (no per-priority pause counters): nothing of it is lossless.
    assert summary.pfc == () and summary.global_pause
    assert "lossless_discards" not in summary.totals
    assert summary.totals["pause_tx"] == dump["tx_global_pause"]  # not + tx_pause_ctrl_phy


def test_without_per_priority_counters_the_port_counter_is_taken() -> None:
    """An older kernel (before 5.6) has no rx_prio<N>_discards: rx_discards_phy and
    rx_packets_phy then, with no priority to call lossless."""
    summary = pause_summary({"rx_discards_phy": 7, "rx_packets_phy": 1000,
                             "rx_prio3_pause": 1, "tx_prio3_pause": 2})
    assert summary.totals == {"discards": 7, "arrived": 1000, "pause_rx": 1, "pause_tx": 2}
    assert summary.drops_from == PHY_DISCARDS and summary.pfc == (3,)


def test_the_pfc_priorities_are_those_whose_pause_counters_are_listed() -> None:
    """A real ConnectX-4 Lx with PFC on priority 0 (`mlnx_qos`: enabled 1 0 0 0 0 0 0 0)
    lists rx_prio0_pause at 0 before any pause: listed is on, whatever the count (the
    blog post "Triggering PFC with GPUDirect RDMA": rx_prio0_pause 0, then 12667 and
    tx_prio0_pause 80 after the test; rx_discards_phy 0)."""
    before = pause_summary({"rx_prio0_pause": 0, "tx_prio0_pause": 0, "rx_discards_phy": 0})
    after = pause_summary({"rx_prio0_pause": 12667, "tx_prio0_pause": 80,
                           "rx_prio0_pause_transition": 5418, "rx_discards_phy": 0})
    assert before.pfc == after.pfc == (0,) and not after.global_pause
    assert after.totals == {"pause_rx": 12667, "pause_tx": 80, "discards": 0}


def connectx7_pfc(prios: dict[int, int]) -> dict[str, int]:
    """A ConnectX-7-style counter set with PFC on the given priorities (prio -> scale),
    plus the neighbours that must not be summed."""
    stats: dict[str, int] = {
        "rx_discards_phy": 11 + 28,  # the same drops as the per-priority ones below
        "rx_packets_phy": 8000 + 28,
        "tx_discards_phy": 1000,  # tx side: not a receive drop
        "rx_pause_ctrl_phy": 1000,  # 802.3 copy of the pause count
        "tx_pause_ctrl_phy": 1000,
    }
    for p in range(8):
        stats[f"rx_prio{p}_packets"] = 1000
        stats[f"rx_prio{p}_discards"] = p
    for p, k in prios.items():
        stats |= {
            f"rx_prio{p}_pause": 1 * k,
            f"rx_prio{p}_pause_duration": 10 * k,
            f"tx_prio{p}_pause": 100 * k,
            f"tx_prio{p}_pause_duration": 1000 * k,
            f"rx_prio{p}_pause_transition": 7777,
            f"rx_prio{p}_buf_discard": 2 * k,
            f"rx_prio{p}_cong_discard": 3 * k,
            f"rx_prio{p}_marked": 8888,
        }
    return stats


def test_summary_sums_pfc_priorities_and_splits_lossless_drops() -> None:
    summary = pause_summary(connectx7_pfc({3: 1, 5: 2}))
    assert summary.totals == {
        "pause_rx": 3,
        "pause_rx_us": 30,
        "pause_tx": 300,
        "pause_tx_us": 3000,
        "pause_tx_us_pfc": 3000,
        "discards": sum(range(8)),  # once: not + rx_discards_phy, not + buf/cong discards
        "arrived": 8000 + sum(range(8)),
        "lossless_discards": 3 + 5,  # priorities 3 and 5 only
        "lossless_arrived": 2000 + 3 + 5,
    }  # no stall-watchdog counters on this port: storm_* absent, not 0
    assert summary.pfc == (3, 5) and not summary.global_pause


def test_summary_absent_counters_stay_absent() -> None:
    assert pause_summary({}).totals == {}
    assert pause_summary({"rx_packets": 5, "rx_prio3_pause_transition": 2}).totals == {}
    assert pause_summary({"rx_prio0_cong_discard": 0}).totals == {}
    assert pause_summary({"rx_global_pause": 0}).totals == {"pause_rx": 0}
    # A priority the driver cannot have (mlx5 has eight) is not read as one.
    assert pause_summary({"rx_prio9_pause": 4, "rx_prio12_discards": 1}) == PauseSummary({})
