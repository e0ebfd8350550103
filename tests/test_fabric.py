"""Fabric collector on temporary /sys trees: every way a counter can lie."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.fabric import (
    DISCOVER_EVERY,
    FabricCollector,
    parse_counter,
    parse_rate,
    parse_state,
)
from agent.files import FileTree
from tests.trees import HW, ib_port, nic, read_as_unprivileged, write


def port(values: dict, pid: str = "mlx5_0:1") -> dict:
    return next(p for p in values["ports"] if p["id"] == pid)


def test_state_rate_and_inventory(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", link_layer="Ethernet", netdev="eth2",
            rate="200 Gb/sec (4X HDR)", state="1: DOWN", phys_state="3: Disabled")
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    values, changed = c.collect(0.0)
    assert changed
    inv = c.inventory()["ports"][0]
    assert inv["id"] == "mlx5_0:1" and inv["port"] == 1
    assert inv["link_layer"] == "Ethernet" and inv["netdev"] == "eth2"
    assert inv["rate"] == 25e9 and inv["rate_text"] == "200 Gb/sec (4X HDR)"
    assert (inv["hca_type"], inv["fw_ver"]) == ("MT4129", "28.39.1002")
    p = port(values)
    assert (p["state"], p["state_name"], p["phys_state"], p["phys_state_name"]) == (
        1, "DOWN", 3, "Disabled")
    assert c.collect(1.0)[1] is False


def test_rates_bytes_are_four_octets_per_count_and_utilization(tmp_path: Path) -> None:
    base = ib_port(tmp_path, "mlx5_0", rate="400 Gb/sec (4X NDR)")
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    first = port(c.collect(0.0)[0])
    assert first["tx_bytes_s"] is None  # one read is not a rate
    assert c.totals["mlx5_0:1"]["tx_bytes"] == 4000 and c.totals["mlx5_0:1"]["rx_bytes"] == 8000
    write(base / "counters/port_xmit_data", f"{1000 + 25 * 10**8}\n")  # 10 GB more over 2 s
    write(base / "counters/port_rcv_data", "2000\n")
    write(base / "counters/port_xmit_packets", "1010\n")
    write(base / "counters/port_xmit_wait", "2005\n")
    p = port(c.collect(2.0)[0])
    assert p["tx_bytes_s"] == 5e9
    assert p["rx_bytes_s"] == 0.0  # a real zero: read twice, no traffic
    assert p["tx_util"] == pytest.approx(0.1)  # of 50 GB/s
    assert p["tx_packets_s"] == 500.0
    assert p["xmit_wait_s"] == 1000.0


def test_error_counters_are_increments(tmp_path: Path) -> None:
    base = ib_port(tmp_path, "mlx5_0", counters={"symbol_error": 10, "link_downed": 1})
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    assert port(c.collect(0.0)[0])["errors_inc"]["symbol_errors"] is None
    write(base / "counters/symbol_error", "17\n")
    p = port(c.collect(1.0)[0])
    assert p["errors_inc"] == {"symbol_errors": 7}  # counters that did not move are left out
    assert c.totals["mlx5_0:1"]["symbol_errors"] == 17


def test_saturated_legacy_counters_give_no_rate_and_flag_the_port(tmp_path: Path) -> None:
    base = ib_port(tmp_path, "mlx5_0", counters={"port_xmit_wait": 2**32 - 1,
                                                 "symbol_error": 2**16 - 1,
                                                 "excessive_buffer_overrun_errors": 15})
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    c.collect(0.0)
    p = port(c.collect(1.0)[0])
    assert p["xmit_wait_s"] is None  # stuck at 2^32-1: unknown, never a false 0
    assert p["errors_inc"]["symbol_errors"] is None
    assert p["errors_inc"]["buffer_overruns"] is None
    assert set(p["saturated"]) == {"xmit_wait", "symbol_errors", "buffer_overruns"}
    # A narrow counter below its maximum still counts.
    write(base / "counters/link_downed", "3\n")
    assert port(c.collect(2.0)[0])["errors_inc"]["link_downed"] == 3
    assert port(c.collect(3.0)[0])["errors_inc"] == {"symbol_errors": None,
                                                     "buffer_overruns": None}


def test_extended_counters_are_preferred_and_never_saturate(tmp_path: Path) -> None:
    base = ib_port(tmp_path, "mlx4_0", counters={"port_xmit_data": 2**32 - 1},
                   ext={"port_xmit_data_64": 2**40, "port_rcv_data_64": 10})
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    c.collect(0.0)
    write(base / "counters_ext/port_xmit_data_64", f"{2**40 + 100}\n")
    p = port(c.collect(1.0)[0], "mlx4_0:1")
    assert c.totals["mlx4_0:1"]["tx_bytes"] == (2**40 + 100) * 4
    assert p["tx_bytes_s"] == 400.0
    assert "saturated" not in p


def test_64_bit_values_in_the_plain_counters_file_are_not_saturation(tmp_path: Path) -> None:
    base = ib_port(tmp_path, "mlx5_0", counters={"port_xmit_data": 2**33})
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    c.collect(0.0)
    write(base / "counters/port_xmit_data", f"{2**33 + 10}\n")
    p = port(c.collect(1.0)[0])
    assert p["tx_bytes_s"] == 40.0 and "saturated" not in p


def test_hw_counters_wrap_at_2_32(tmp_path: Path) -> None:
    base = ib_port(tmp_path, "mlx5_0", link_layer="Ethernet",
                   hw={**HW, "np_cnp_sent": 2**32 - 100})
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    c.collect(0.0)
    write(base / "hw_counters/np_cnp_sent", "400\n")
    write(base / "hw_counters/rp_cnp_handled", "150\n")
    p = port(c.collect(2.0)[0])
    assert p["hw"]["np_cnp_sent"] == 250.0  # 500 counted across the wrap, over 2 s
    assert p["hw"]["rp_cnp_handled"] == 50.0
    assert c.hw_totals["mlx5_0:1"]["np_cnp_sent"] == 400


def test_counter_reset_restarts_the_baseline(tmp_path: Path) -> None:
    base = ib_port(tmp_path, "mlx5_0", counters={"port_rcv_data": 10**9, "port_rcv_errors": 50})
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    c.collect(0.0)
    write(base / "counters/port_rcv_data", "100\n")
    write(base / "counters/port_rcv_errors", "0\n")
    p = port(c.collect(1.0)[0])
    assert p["rx_bytes_s"] is None and p["errors_inc"]["rcv_errors"] is None  # reset: unknown
    write(base / "counters/port_rcv_data", "350\n")
    assert port(c.collect(2.0)[0])["rx_bytes_s"] == 1000.0


def test_no_pma_missing_and_garbage_counters_have_reasons(tmp_path: Path) -> None:
    ib_port(tmp_path, "i40iw0", counters={"port_xmit_data": "N/A (no PMA)",
                                          "port_rcv_data": "\x00\xffgarbage",
                                          "symbol_error": None})
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    c.collect(0.0)
    p = port(c.collect(1.0)[0], "i40iw0:1")
    assert p["counter_errors"]["tx_bytes"] == "N/A (no PMA)"
    assert p["counter_errors"]["rx_bytes"].startswith("not a counter")
    assert p["counter_errors"]["symbol_errors"] == "missing"
    assert p["tx_bytes_s"] is None and c.totals["i40iw0:1"]["tx_bytes"] is None
    assert c.totals["i40iw0:1"]["tx_packets"] == 10  # the rest of the port still reads


def test_retransmission_counters_are_read_on_the_error_cadence(tmp_path: Path) -> None:
    """Congestion notifications are read every second; the sequence-error and
    retransmission counters when the error counters are, their rate over those
    seconds standing between."""
    ib_port(tmp_path, "mlx5_0", link_layer="Ethernet", hw=HW)
    base = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    c = FabricCollector(FileTree(tmp_path), errors_every=5)
    c.collect(0.0)
    rates = []
    for t in range(1, 11):
        write(base / "hw_counters/np_cnp_sent", f"{HW['np_cnp_sent'] + 10 * t}\n")
        write(base / "hw_counters/local_ack_timeout_err",
              f"{HW['local_ack_timeout_err'] + 3 * t}\n")
        values, _ = c.collect(float(t))
        hw = values["ports"][0]["hw"]
        rates.append((hw["np_cnp_sent"], hw["local_ack_timeout_err"]))
        assert c.hw_totals["mlx5_0:1"]["np_cnp_sent"] == HW["np_cnp_sent"] + 10 * t
    assert [cnp for cnp, _ in rates] == [10.0] * 10
    # Read at samples 0, 5 and 10: nothing known until the second read, then 3/s.
    assert [timeouts for _, timeouts in rates] == [None] * 4 + [3.0] * 6


def _until_changed(c: FabricCollector, t: float) -> tuple[dict[str, Any], int]:
    for n in range(1, 3 * DISCOVER_EVERY):
        values, changed = c.collect(t + n)
        if changed:
            return values, n
    raise AssertionError("the inventory change was never seen")


def test_a_device_appearing_and_disappearing_between_samples(tmp_path: Path) -> None:
    # The device directories are listed every DISCOVER_EVERY samples, not each second:
    # a device that comes or goes is in the next listing.
    ib_port(tmp_path, "mlx5_0")
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    c.collect(0.0)
    ib_port(tmp_path, "mlx5_1")
    values, n = _until_changed(c, 0.0)
    assert n <= DISCOVER_EVERY
    assert [p["id"] for p in values["ports"]] == ["mlx5_0:1", "mlx5_1:1"]
    shutil.rmtree(tmp_path / "sys/class/infiniband/mlx5_0")
    values, n = _until_changed(c, 100.0)
    assert n <= DISCOVER_EVERY
    assert [p["id"] for p in values["ports"]] == ["mlx5_1:1"]
    assert [p["id"] for p in c.inventory()["ports"]] == ["mlx5_1:1"]
    assert not [rel for rel in c.files._fds if "mlx5_0" in rel]  # its descriptors closed


def test_a_port_whose_files_stop_answering_is_listed_again_at_once(tmp_path: Path) -> None:
    # sysfs fails the reads of a device that went away (ENODEV): the port is dropped at
    # the next sample, not at the next listing. A port whose state file is gone reads
    # the same way.
    ib_port(tmp_path, "mlx5_0")
    ib_port(tmp_path, "mlx5_1")
    files = FileTree(tmp_path)
    c = FabricCollector(files, errors_every=1)
    c.collect(0.0)
    c.collect(1.0)
    shutil.rmtree(tmp_path / "sys/class/infiniband/mlx5_0")
    files.forget("sys/class/infiniband/mlx5_0")  # what ENODEV does to a kept descriptor
    values, changed = c.collect(2.0)  # the read fails: the port reads nil, and is noted
    assert values["ports"][0]["state"] is None
    values, changed = c.collect(3.0)
    assert changed and [p["id"] for p in values["ports"]] == ["mlx5_1:1"]


def test_no_infiniband_at_all_says_so(tmp_path: Path) -> None:
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    values, _ = c.collect(0.0)
    assert values == {"ports": [], "nics": []}
    assert "no InfiniBand/RoCE devices" in (c.status or "")


def test_nics_skip_loopback_and_virtual_and_rate_their_counters(tmp_path: Path) -> None:
    nic(tmp_path, "eth0", speed=100000, rx_bytes=1000)
    write(tmp_path / "sys/class/net/lo/statistics/rx_bytes", "5\n")
    write(tmp_path / "sys/class/net/veth1/statistics/rx_bytes", "5\n")  # no device link
    c = FabricCollector(FileTree(tmp_path), errors_every=1)
    c.collect(0.0)
    write(tmp_path / "sys/class/net/eth0/statistics/rx_bytes", f"{1000 + 125 * 10**7}\n")
    write(tmp_path / "sys/class/net/eth0/statistics/rx_errors", "garbage\n")
    values, _ = c.collect(1.0)
    assert [n["id"] for n in values["nics"]] == ["eth0"]
    eth0 = values["nics"][0]
    assert eth0["rx_bytes_s"] == 1.25e9 and eth0["rx_util"] == pytest.approx(0.1)
    assert eth0["rx_errors_s"] is None and "rx_errors" in eth0["counter_errors"]
    assert eth0["operstate"] == "up"


@pytest.mark.parametrize(("text", "expected"), [
    ("4: ACTIVE", (4, "ACTIVE")), ("5: LinkUp\n", (5, "LinkUp")), ("ACTIVE", (None, "ACTIVE")),
])
def test_parse_state(text: str, expected: tuple) -> None:
    assert parse_state(text) == expected


def test_parse_rate_and_counter() -> None:
    assert parse_rate("100 Gb/sec (4X EDR)") == 12.5e9
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5e9 / 8
    assert parse_rate("garbage") is None
    assert parse_counter("42\n") == 42
    for bad in ("N/A (no PMA)", "-1", "", "12abc"):
        with pytest.raises(ValueError):
            parse_counter(bad)


def test_permission_denied_counters_have_the_reason(tmp_path: Path) -> None:
    import json

    base = ib_port(tmp_path, "mlx5_0")
    (base / "counters/symbol_error").chmod(0)
    p = json.loads(read_as_unprivileged(
        "import json\nfrom agent.collectors.fabric import FabricCollector\n"
        "from agent.files import FileTree\n"
        f"v, _ = FabricCollector(FileTree({str(tmp_path)!r})).collect(0.0)\n"
        "print(json.dumps(v['ports'][0]))"))
    assert p["counter_errors"]["symbol_errors"] == "permission denied"
    assert p["errors_inc"]["symbol_errors"] is None
    assert p["state"] == 4  # the rest of the port still reads


def test_error_counters_are_read_every_few_samples_and_at_once_on_link_down(
        tmp_path: Path) -> None:
    base = ib_port(tmp_path, "mlx5_0", counters={"symbol_error": 1})
    c = FabricCollector(FileTree(tmp_path), errors_every=5)
    c.collect(0.0)
    write(base / "counters/symbol_error", "4\n")
    write(base / "counters/port_xmit_data", "5000\n")
    p = port(c.collect(1.0)[0])
    assert "errors_inc" not in p  # not read this second
    assert p["tx_bytes_s"] == 16000.0  # data counters are
    for t in (2.0, 3.0, 4.0):
        c.collect(t)
    p = port(c.collect(5.0)[0])
    assert p["errors_inc"] == {"symbol_errors": 3}  # the increment over the 5 s
    write(base / "counters/link_downed", "1\n")
    write(base / "state", "1: DOWN\n")
    p = port(c.collect(6.0)[0])
    assert p["state"] == 1 and p["errors_inc"] == {"link_downed": 1}


def test_saturation_and_reasons_persist_between_reads_of_error_counters(
        tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", counters={"symbol_error": 2**16 - 1, "link_downed": None})
    c = FabricCollector(FileTree(tmp_path), errors_every=5)
    for t in range(4):
        p = port(c.collect(float(t))[0])
        assert p["saturated"] == ["symbol_errors"], t
        assert p["counter_errors"]["link_downed"] == "missing", t
        # A counter the port has no file of has nothing to count: not "could not be
        # counted" (a port a readout would count as bad every few samples).
        assert "link_downed" not in (p.get("errors_inc") or {}), t
    # Stuck, then unreadable: not known to be stuck any more, between reads either.
    write(tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error", "garbage\n")
    t = 4
    while "not a counter" not in p["counter_errors"].get("symbol_errors", ""):
        p = port(c.collect(float(t))[0])  # until the error counters are read again
        t += 1
    for later in range(t, t + 10):
        assert "saturated" not in p, later
        p = port(c.collect(float(later))[0])


def test_metrics_mark_the_counters_that_are_there_and_cannot_be_read(
        tmp_path: Path) -> None:
    """/metrics leaves out a counter that cannot be read and marks it, so a reader that
    counts what the error counters grew by does not take its absence for 0. A counter
    this port has no file for is not marked (nothing to read, ever), and neither is a
    saturated one (read, stuck: its own mark)."""
    import asyncio
    import time

    from prometheus_client.parser import text_string_to_metric_families

    from agent.metrics import make_registry, render
    from tests.conftest import make_agent
    from tuimon_core.protocol.fields import PORT_UNREADABLE_METRIC

    base = ib_port(tmp_path, "mlx5_0", counters={
        "symbol_error": "garbage", "port_rcv_errors": None, "link_downed": "N/A (no PMA)",
        "port_xmit_wait": 2**32 - 1, "local_link_integrity_errors": 3})
    agent = make_agent(tmp_path, None)

    def series() -> tuple[set[str], set[str]]:
        """(the counters marked, the port's series exported)."""
        text = render(make_registry(agent)).decode()
        found = [(s.name, s.labels) for f in text_string_to_metric_families(text)
                 for s in f.samples]
        return ({labels["counter"] for name, labels in found if name == PORT_UNREADABLE_METRIC},
                {name for name, labels in found if labels.get("device") == "mlx5_0"})

    async def scrapes() -> list[tuple[set[str], set[str]]]:
        await agent.start(sampling=False)
        await agent.sample_once()
        await agent.sample_once()
        seen = [series()]
        # A scrape while the next sample is collected (its fabric read, its storage not
        # yet): the counters as read now, each exported or marked, never neither.
        (base / "counters" / "local_link_integrity_errors").write_text("garbage\n")
        for _ in range(agent.fabric.errors_every):  # one of them reads the error counters
            agent.fabric.collect(time.monotonic())
        seen.append(series())
        await agent.stop()
        return seen

    (marked, exported), (marked_now, exported_now) = asyncio.run(scrapes())
    assert marked == {"symbol_errors", "link_downed"}
    assert "tuimon_ib_port_symbol_errors_total" not in exported
    assert "tuimon_ib_port_receive_errors_total" not in exported
    assert "tuimon_ib_port_local_link_integrity_errors_total" in exported  # the rest read
    assert marked_now == {"symbol_errors", "link_downed", "local_link_integrity_errors"}
    assert "tuimon_ib_port_local_link_integrity_errors_total" not in exported_now


def test_a_fabric_read_during_a_scrape_leaves_each_counter_exported_or_marked(
        tmp_path: Path) -> None:
    """/metrics is rendered on the agent's loop while the fabric is read in a worker
    thread: a read that lands between two of the port's families must not leave a
    counter neither exported nor marked (a reader would take it for 0, and count its
    whole total again when it is back)."""
    import asyncio
    import time

    from agent.metrics import _fabric_metrics
    from tests.conftest import make_agent
    from tuimon_core.protocol.fields import PORT_COUNTERS_READ, PORT_UNREADABLE_METRIC

    symbol = ib_port(tmp_path, "mlx5_0", counters={"symbol_error": "garbage"}) / "counters" \
        / "symbol_error"
    agent = make_agent(tmp_path, None)

    async def scrape() -> list:
        await agent.start(sampling=False)
        await agent.sample_once()
        fabric, hello = agent.latest.extra["fabric"], agent.hello
        families = _fabric_metrics("node-a", fabric, hello, agent.fabric)
        seen = [next(families) for _ in PORT_COUNTERS_READ]  # the counters' families
        symbol.write_text("40\n")  # readable again, read by the worker meanwhile
        for _ in range(agent.fabric.errors_every):
            agent.fabric.collect(time.monotonic())
        seen += list(families)  # the rest, the marks among them
        await agent.stop()
        return seen

    families = asyncio.run(scrape())
    exported = {f.name for f in families if f.samples}
    marked = {s.labels["counter"] for f in families if f.name == PORT_UNREADABLE_METRIC
              for s in f.samples}
    assert ("tuimon_ib_port_symbol_errors" in exported) != ("symbol_errors" in marked)
