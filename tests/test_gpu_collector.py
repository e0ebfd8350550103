"""The GPU collector against a fake pynvml: units, unsupported fields, failures."""

from __future__ import annotations

from typing import Any

import pytest

from agent.collectors.gpu import GpuCollector, decode_clock_events, load_nvml
from agent.sim.fake_nvml import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NO_PERMISSION,
    FakeGpu,
    FakeNvml,
    NVMLError,
)


def started(fake: FakeNvml) -> GpuCollector:
    c = GpuCollector(lambda: fake)
    c.start()
    return c


def test_reads_eight_gpus_in_si_units(fake_nvml: FakeNvml) -> None:
    # Through the module name: the collector imports `pynvml`, which the fixture faked.
    c = GpuCollector(load_nvml)
    c.start()
    assert c.status is None
    assert c.driver_version == "550.90.07"
    assert [g.index for g in c.inventory] == list(range(8))
    info = c.inventory[3]
    assert info.uuid == fake_nvml.gpus[3].uuid
    assert info.mem_total == 80 * 1024**3
    assert info.power_limit == 700.0
    assert info.max_sm_clock == 1980e6
    assert info.pci_bus_id.startswith("00000000:")
    gpus, events = c.collect(now=1.0, wall=1000.0)
    assert len(gpus) == 8 and events == []
    g = gpus[3]
    assert g["util"] == 0.9 and g["mem_util"] == 0.5
    assert g["mem_used"] == 60 * 1024**3
    assert g["temp"] == 63.0
    assert g["power"] == 600.0 and g["power_limit"] == 700.0
    assert g["energy"] == 4000.0  # mJ to J
    assert g["sm_clock"] == 1980e6 and g["mem_clock"] == 2619e6
    assert g["clock_events"] == []
    assert g["pstate"] == 0
    assert g["ecc_corrected"] == 0 and g["ecc_uncorrected"] == 0
    assert g["remapped_rows"] == 0 and g["remap_failed"] == 0
    assert g["procs"] == 1 and g["proc_mem"] == 50 * 1024**3
    assert g["pcie_tx"] == 0.0  # this driver (550) has no PCIe byte fields: the call's
    assert g["nvlink_tx"] is None  # a rate needs two reads
    assert "errors" not in g and "failed" not in g


def test_nvlink_rate_comes_from_the_counter_and_elapsed_time(fake_nvml: FakeNvml) -> None:
    c = started(fake_nvml)
    c.collect(now=10.0, wall=0)
    fake_nvml.gpus[0].nvlink_tx_kib = 2 * 1024 * 1024  # 2 GiB later
    fake_nvml.gpus[0].nvlink_rx_kib = 1024
    gpus, _ = c.collect(now=12.0, wall=0)
    assert gpus[0]["nvlink_tx"] == 1024**3  # bytes per second over the 2 s
    assert gpus[0]["nvlink_rx"] == 512 * 1024  # 1 MiB over 2 s
    assert gpus[0]["nvlink_tx_total"] == 2 * 1024**3


def test_counter_reset_gives_no_rate_instead_of_a_negative_one(fake_nvml: FakeNvml) -> None:
    c = started(fake_nvml)
    fake_nvml.gpus[0].nvlink_tx_kib = 10_000
    c.collect(now=1.0, wall=0)
    fake_nvml.gpus[0].nvlink_tx_kib = 5  # driver reload
    gpus, _ = c.collect(now=2.0, wall=0)
    assert gpus[0]["nvlink_tx"] is None


def test_unsupported_fields_are_nil_and_not_errors() -> None:
    gpus = [FakeGpu(0, unsupported={"nvmlDeviceGetTotalEnergyConsumption",
                                    "nvmlDeviceGetPcieThroughput",
                                    "nvmlDeviceGetTotalEccErrors"},
                    nvlink_tx_kib=None, nvlink_rx_kib=None, remapped=None)]
    gpus[0].retired_pages = ([0x1000, 0x2000], [0x3000])
    c = started(FakeNvml(gpus))
    values, _ = c.collect(1.0, 0)
    g = values[0]
    for key in ("energy", "pcie_tx", "pcie_rx", "ecc_corrected", "ecc_uncorrected",
                "nvlink_tx_total", "nvlink_tx", "remapped_rows", "remap_pending"):
        assert g[key] is None, key
    assert "errors" not in g
    # Pre-Ampere: page retirement instead of row remapping.
    assert g["retired_pages"] == 3
    assert g["retired_pending"] == 0
    assert g["temp"] is not None


def test_other_nvml_errors_are_nil_with_the_reason() -> None:
    gpus = [FakeGpu(0, errors={"nvmlDeviceGetPowerUsage": NVML_ERROR_NO_PERMISSION})]
    values, _ = started(FakeNvml(gpus)).collect(1.0, 0)
    assert values[0]["power"] is None
    assert values[0]["errors"] == {"power": "Insufficient Permissions"}


def test_ecc_and_energy_come_with_the_field_values_call_or_by_their_own() -> None:
    gpus = [FakeGpu(0, energy_mj=5_000, ecc_corrected=3, ecc_uncorrected=1),
            FakeGpu(1, errors={"nvmlDeviceGetTotalEccErrors": NVML_ERROR_NO_PERMISSION}),
            FakeGpu(2, energy_mj=7_000, ecc_corrected=4,
                    unsupported={"nvmlDeviceGetFieldValues"})]  # an older binding
    values, _ = started(FakeNvml(gpus)).collect(1.0, 0)
    assert (values[0]["energy"], values[0]["ecc_corrected"], values[0]["ecc_uncorrected"]) \
        == (5.0, 3, 1)
    # A field the call does not answer is read by its own call: the reason is kept.
    assert values[1]["ecc_corrected"] is None and values[1]["ecc_uncorrected"] is None
    assert values[1]["errors"] == {"ecc_corrected": "Insufficient Permissions",
                                   "ecc_uncorrected": "Insufficient Permissions"}
    assert (values[2]["energy"], values[2]["ecc_corrected"]) == (7.0, 4)
    assert "errors" not in values[2]
    # A driver that answers the call and not the field ("not supported"): the call says.
    quiet = started(FakeNvml([FakeGpu(0, ecc_corrected=2, ecc_uncorrected=1, energy_mj=9_000,
                                       unsupported={"field:5", "field:6", "field:83"})]))
    g = quiet.collect(1.0, 0)[0][0]
    assert (g["ecc_corrected"], g["ecc_uncorrected"], g["energy"]) == (2, 1, 9.0)

    # NVML calls a sample of one GPU makes, on a driver with the PCIe byte fields and a
    # GPU that has moved more than 4 GiB over PCIe since it loaded.
    busy = {"pcie_tx_bytes": 1 << 40, "pcie_rx_bytes": 1 << 40}
    answered = calls_per_read(FakeGpu(0, **busy), FakeNvml, R560)
    assert answered <= 12  # the five ride on the field values call
    assert calls_per_read(FakeGpu(0, errors={"nvmlDeviceGetTotalEccErrors": 4}, **busy),
                          FakeNvml, R560) == answered + 2
    assert calls_per_read(FakeGpu(0, unsupported={"nvmlDeviceGetFieldValues"}, **busy),
                          FakeNvml, R560) == answered + 5
    # Before R555 the two PCIe throughput calls of their own.
    assert calls_per_read(FakeGpu(0, **busy), FakeNvml) == answered + 2


R560 = "560.35.03"  # a driver with the PCIe byte fields (from R555)


def calls_per_read(gpu: FakeGpu, kind: type[FakeNvml], driver: str = "550.90.07") -> int:
    """NVML calls one read of this one GPU makes, after the first."""
    fake = kind([gpu], driver_version=driver)
    c = started(fake)
    c.collect(1.0, 0)
    before = fake.calls
    c.collect(2.0, 0)
    return fake.calls - before


def test_pcie_rates_come_from_the_byte_counters_over_the_whole_interval() -> None:
    gpu = FakeGpu(0, pcie_tx_kbs=7, pcie_rx_kbs=9)  # what a 20 ms window would say
    c = started(FakeNvml([gpu], driver_version=R560))
    gpu.pcie_tx_bytes, gpu.pcie_rx_bytes = 10**12, 5 * 10**11
    g = c.collect(10.0, 0)[0][0]
    assert (g["pcie_tx"], g["pcie_rx"]) == (7 * 1024, 9 * 1024)  # no rate yet: the call's
    gpu.pcie_tx_bytes += 24 * 10**9  # 24 GB and 2 GB over the 2 s
    gpu.pcie_rx_bytes += 2 * 10**9
    g = c.collect(12.0, 0)[0][0]
    assert (g["pcie_tx"], g["pcie_rx"]) == (12e9, 1e9)
    gpu.pcie_tx_bytes = 5  # the driver reloaded: never a negative rate; the call's once
    g = c.collect(13.0, 0)[0][0]
    assert (g["pcie_tx"], g["pcie_rx"]) == (7 * 1024, 9 * 1024)
    gpu.pcie_tx_bytes += 3 * 10**9
    g = c.collect(14.0, 0)[0][0]
    assert (g["pcie_tx"], g["pcie_rx"]) == (3e9, 0.0)  # known wide: counted from 5 on
    assert "errors" not in g


@pytest.mark.parametrize(("gpu", "driver"), [
    (FakeGpu(0, pcie_tx_bytes=1 << 40, pcie_rx_bytes=1 << 40), "550.90.07"),
    (FakeGpu(0, pcie_tx_bytes=1 << 40, pcie_rx_bytes=1 << 40, unsupported={"field:197"}),
     R560),
    (FakeGpu(0, pcie_tx_bytes=1 << 40, pcie_rx_bytes=1 << 40, pcie_count_type=0), R560),
    (FakeGpu(0, pcie_tx_bytes=10**6, pcie_rx_bytes=10**6), R560),
    (FakeGpu(0, pcie_tx_bytes=1 << 40, pcie_rx_bytes=1 << 40,
             unsupported={"nvmlDeviceGetFieldValues"}), R560),
], ids=["before R555", "no field", "not an integer", "not yet past 2^32", "no call"])
def test_pcie_rates_fall_back_to_the_throughput_call(gpu: FakeGpu, driver: str) -> None:
    """Where the byte counters are not there, not integers, or not known to be wider
    than 32 bits (one that wraps several times a second would read low, unseen)."""
    gpu.pcie_tx_kbs, gpu.pcie_rx_kbs = 1500, 250
    c = started(FakeNvml([gpu], driver_version=driver))
    for t in (1.0, 2.0, 3.0):
        g = c.collect(t, 0)[0][0]  # the call's own 20 ms window, at the first read too
        # NVML's "KB/s" are of 1024 bytes, as DCGM's copy of the same value is read.
        assert (g["pcie_tx"], g["pcie_rx"]) == (1500 * 1024, 250 * 1024)
        gpu.pcie_tx_bytes += 10**9


class _OlderDriver(FakeNvml):
    """A driver that refuses the whole field-values call for field ids newer than
    itself (the PCIe byte counters)."""

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[Any]) -> list[Any]:
        if any((f[0] if isinstance(f, tuple) else f) in (197, 198) for f in ids):
            self._gpu(h, "nvmlDeviceGetFieldValues")  # counted as a call
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return super().nvmlDeviceGetFieldValues(h, ids)


def test_a_driver_refusing_the_newer_fields_keeps_its_nvlink_and_ecc_counters() -> None:
    gpus = [FakeGpu(i, pcie_tx_kbs=1500, ecc_corrected=2, energy_mj=9_000) for i in range(2)]
    c = started(_OlderDriver(gpus))
    c.collect(1.0, 0)
    gpus[0].nvlink_tx_kib = 1024 * 1024
    values, _ = c.collect(2.0, 0)
    for g in values:
        assert "errors" not in g, g["errors"]
        assert g["pcie_tx"] == 1500 * 1024  # the throughput call, as before the fields
        assert (g["ecc_corrected"], g["energy"]) == (2, 9.0)
    assert values[0]["nvlink_tx"] == 1024**3
    # Refused once, on the first read: from then on no call more than a driver that
    # answers the call and not the fields.
    assert calls_per_read(FakeGpu(0), _OlderDriver) == \
        calls_per_read(FakeGpu(0, unsupported={"field:197"}), FakeNvml)


class _Flaky(FakeNvml):
    """A driver whose field-values call fails once, with an error of the GPU's."""

    fail_at: int | None = None

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[Any]) -> list[Any]:
        if self.fail_at is not None and self.calls >= self.fail_at:
            self.fail_at = None
            self._gpu(h, "nvmlDeviceGetFieldValues")
            raise NVMLError(999)  # NVML_ERROR_UNKNOWN
        return super().nvmlDeviceGetFieldValues(h, ids)


@pytest.mark.parametrize("first", [False, True], ids=["later read", "first read"])
def test_one_failed_field_values_call_keeps_the_byte_counters(first: bool) -> None:
    """An error of the GPU's on the call (not a refusal of the newer ids) is that
    read's: the counters are asked again at the next read, on every GPU."""
    gpus = [FakeGpu(i, pcie_tx_bytes=1 << 40, pcie_rx_bytes=1 << 40) for i in range(2)]
    fake = _Flaky(gpus, driver_version=R560)
    fake.fail_at = 0
    c = GpuCollector(lambda: fake)
    c.start()
    if not first:
        c.collect(1.0, 0)
        fake.fail_at = fake.calls
    failed = c.collect(2.0, 0)[0][0]
    assert "field_values" in failed["errors"]
    c.collect(3.0, 0)
    for g in gpus:
        g.pcie_tx_bytes += 8 * 10**9
    values, _ = c.collect(4.0, 0)
    assert [g["pcie_tx"] for g in values] == [8e9, 8e9]


def test_a_gpu_without_pcie_counters_or_throughput_says_nil_and_no_error() -> None:
    gpu = FakeGpu(0, unsupported={"nvmlDeviceGetPcieThroughput"})  # vGPU: neither
    c = started(FakeNvml([gpu]))
    c.collect(1.0, 0)
    g = c.collect(2.0, 0)[0][0]
    assert g["pcie_tx"] is None and g["pcie_rx"] is None
    assert "errors" not in g


def test_gpu_lost_mid_run_fails_that_gpu_only_and_recovers(fake_nvml: FakeNvml) -> None:
    c = started(fake_nvml)
    c.collect(1.0, 100.0)
    fake_nvml.gpus[5].lost = True
    gpus, events = c.collect(2.0, 101.0)
    assert gpus[5] == {"failed": "GPU is lost", "xid_total": 0, "last_xid": None}
    assert all("failed" not in g for i, g in enumerate(gpus) if i != 5)
    assert all(g["temp"] is not None for i, g in enumerate(gpus) if i != 5)
    assert [(e.kind, e.gpu, e.severity) for e in events] == [("gpu_failed", 5, "critical")]
    # Still failed: no second event.
    _, events = c.collect(3.0, 102.0)
    assert events == []
    fake_nvml.gpus[5].lost = False
    gpus, events = c.collect(4.0, 103.0)
    assert "failed" not in gpus[5]
    assert [(e.kind, e.gpu) for e in events] == [("gpu_recovered", 5)]


def test_no_driver_says_why_and_reads_nothing() -> None:
    c = started(FakeNvml(8, driver=False))
    assert c.nvml is None
    assert "NVML Shared Library Not Found" in (c.status or "")
    assert c.collect(1.0, 0) == ([], [])


def test_missing_binding_says_why() -> None:
    def broken():  # type: ignore[no-untyped-def]
        raise ImportError("No module named 'pynvml'")

    c = GpuCollector(broken)
    c.start()
    assert "No module named 'pynvml'" in (c.status or "")


def test_new_uncorrected_ecc_errors_raise_an_event(fake_nvml: FakeNvml) -> None:
    c = started(fake_nvml)
    c.collect(1.0, 0)
    fake_nvml.gpus[2].ecc_uncorrected = 3
    _, events = c.collect(2.0, 0)
    assert [(e.kind, e.gpu, e.severity) for e in events] == [("ecc", 2, "critical")]
    assert "3 new uncorrected" in events[0].message


def test_inventory_change_is_detected(fake_nvml: FakeNvml) -> None:
    c = started(fake_nvml)
    assert not c.device_count_changed()
    fake_nvml.gpus.pop()
    assert c.device_count_changed()
    assert c.refresh_inventory()
    assert len(c.inventory) == 7


@pytest.mark.parametrize(("mask", "names"), [
    (0, []),
    (0x1, ["gpu_idle"]),
    (0x4 | 0x40, ["sw_power_cap", "hw_thermal_slowdown"]),
    (0x1000, ["unknown_0x1000"]),
])
def test_clock_event_reasons_decode_to_names(mask: int, names: list[str]) -> None:
    assert decode_clock_events(mask) == names


def test_thermal_throttle_shows_in_the_sample(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[1].clock_events = 0x20 | 0x40
    gpus, _ = started(fake_nvml).collect(1.0, 0)
    assert gpus[1]["clock_events"] == ["sw_thermal_slowdown", "hw_thermal_slowdown"]


def test_a_gpu_in_mig_mode_lists_its_instances_and_says_what_nvml_will_not() -> None:
    """Values from a real A100-SXM4-80GB in MIG mode (nvidia-smi -q, telegraf's test data:
    four instances, GPU instance ids 3 to 6, 19968 MiB each, 12 MiB used)."""
    from agent.collectors.gpu import GpuCollector
    from agent.sim.fake_nvml import FakeGpu, FakeMig, FakeNvml

    mib = 1024**2
    a100 = FakeGpu(0, name="NVIDIA A100-SXM4-80GB", mem_total=81920 * mib, mem_used=50 * mib,
                   util_gpu=0,
                   mig=[FakeMig(gi, profile="1g.20gb", mem_total=19968 * mib,
                                mem_used=12 * mib, procs=[(4000 + gi, 8 * mib)] if gi == 3
                                else []) for gi in (3, 4, 5, 6)])
    plain = FakeGpu(1, util_gpu=80, mig=[])
    collector = GpuCollector(lambda: FakeNvml([a100, plain]))
    collector.start()
    gpus, _ = collector.collect(0.0, 0.0)
    mig, other = gpus
    assert mig["mig_mode"] == 1 and other["mig_mode"] == 0
    # NVML will not give the whole GPU's utilization in MIG mode: nil, with the reason.
    assert mig["util"] is None and "MIG mode" in mig["errors"]["util"]
    assert mig["mem_total"] == 81920 * mib and mig["power"] is not None
    assert [(m["gi"], m["profile"], m["mem_total"], m["mem_used"], m["procs"])
            for m in mig["mig"]] == [(gi, "1g.20gb", 19968 * mib, 12 * mib, 1 if gi == 3 else 0)
                                     for gi in (3, 4, 5, 6)]
    assert mig["mig"][0]["uuid"].startswith("MIG-")
    assert other["util"] == 0.8 and "mig" not in other
    # The frame carries it, and /metrics lists each instance under its GPU.
    from tuimon_core.protocol import Sample, decode, encode

    decoded = decode(encode(Sample(seq=1, ts=0.0, interval=1.0, gpus=gpus)))
    assert decoded.gpus[0]["mig"][1]["gi"] == 4


async def test_mig_instances_in_metrics(proc_root) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client.parser import text_string_to_metric_families

    from agent.metrics import make_registry, render
    from agent.sim.fake_nvml import FakeGpu, FakeMig, FakeNvml
    from tests.conftest import make_agent

    mib = 1024**2
    fake = FakeNvml([FakeGpu(0, mig=[FakeMig(3, "2g.20gb"), FakeMig(5, "2g.20gb")])])
    agent = make_agent(proc_root, fake)
    await agent.start(sampling=False)
    try:
        await agent.sample_once()
        text = render(make_registry(agent)).decode()
    finally:
        await agent.stop()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    total = {s.labels["gpu_instance"]: (s.labels["profile"], s.value)
             for s in fams["tuimon_gpu_mig_memory_total_bytes"].samples}
    assert total == {"3": ("2g.20gb", 19968 * mib), "5": ("2g.20gb", 19968 * mib)}
    assert fams["tuimon_gpu_mig_mode"].samples[0].value == 1
    assert "tuimon_gpu_utilization_ratio" not in fams or not fams[
        "tuimon_gpu_utilization_ratio"].samples
