"""Who runs on each GPU: NVML's process list named from a temporary /proc whose cgroup
files are real ones (tests/fixtures/real/cgroup, sources in its README), through the
wire, onto the node screen."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.collectors.gpu import GpuCollector
from agent.collectors.processes import CHECK_EVERY, ProcessNames, parse_cgroup
from agent.files import FileTree
from agent.sim.fake_nvml import FakeGpu, FakeMig, FakeNvml
from tests.trees import write

REAL = Path(__file__).parent / "fixtures" / "real" / "cgroup"

# file -> (Slurm job, pod uid, container, runtime), read off each file by hand.
EXPECTED = {
    "slurm_v1_freezer_only": ("748468", None, None, None),
    "slurm_v1_task_cgroup": ("11811379", None, None, None),
    "slurm_v1_step_interactive": ("280678", None, None, None),
    "slurm_v1_no_job_cgroup": (None, None, None, None),
    "slurm_v2_task": ("4", None, None, None),
    "slurm_v2_fox": ("1392969", None, None, None),
    "slurm_v2_stepd_infinity": (None, None, None, None),
    "slurm_v2_slurmd": (None, None, None, None),
    "host_v2_user_session": (None, None, None, None),
    "k8s_containerd_v2_systemd": (
        None, "121157b5-c67d-4c3e-9052-cb27bbb711fb", "1cd3449e930b", "containerd"),
    "k8s_containerd_v1_cgroupfs": (
        None, "a36d0c1d-0b26-4451-8d80-9c195e004afa", "5dd96d5394ca", None),
    "k8s_containerd_v1_colon_form": (
        None, "2105e389-7471-476e-a50f-6074cef29bbd", "d3d8ccf5cca9", "containerd"),
    "k8s_crio_v1_systemd": (
        None, "8ca306fa-3c03-47fa-97dd-19979c345572", "d6d725b909f3", "crio"),
    "k8s_crio_v1_static_pod": (None, "487a0dc6dccaeefbcfedba7a7ce1ca18", "7a1fd6fe8cdf", "crio"),
    "k8s_crio_v2_systemd": (
        None, "042efd86-1f3b-4f2f-8736-f31c58e95bbc", "f33f47b0db74", "crio"),
    "k8s_docker_v1_below_container": (
        None, "f8a694f2-7c08-11e9-98da-000c29077430", "c04e0a88a1de", None),
    "k8s_docker_v2_ns_relative": (
        None, "fd698699-eabf-4c23-92ef-cf0bbdb78261", "2cc65c162ca1", "docker"),
    "docker_v1_systemd": (None, None, "9ec39b91f3d7", "docker"),
    "docker_v2_private_ns": (None, None, None, None),
}


def test_every_real_sample_has_an_expectation() -> None:
    assert sorted(p.stem for p in REAL.glob("*.cgroup")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_cgroup_files_name_the_job_or_the_pod(name: str) -> None:
    got = parse_cgroup((REAL / f"{name}.cgroup").read_text())
    assert (got.job, got.pod_uid, got.container, got.runtime) == EXPECTED[name]


def test_garbage_cgroup_files_name_nothing() -> None:
    for text in ("", "\0\0\0", "no colons here", "0::", "1:cpu:/slurm/uid_1/job_x/step_0",
                 "0::/kubepods/podnot-a-uid/abc"):
        got = parse_cgroup(text)
        assert (got.job, got.pod_uid, got.container) == (None, None, None), text


def proc(root: Path, pid: int, *, uid: int, argv: list[str], cgroup: str,
         start: int = 1000) -> None:
    base = root / "proc" / str(pid)
    # The command holds a space and a parenthesis, as /proc/<pid>/stat allows.
    write(base / "stat", f"{pid} (python3 (x)) S 1 {pid} {pid} 0 -1 4194560 1021 0 0 0 "
          f"3 1 0 0 20 0 1 0 {start} 9000000 500 18446744073709551615\n")
    write(base / "status", f"Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\n"
          f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t100\t100\t100\t100\n")
    write(base / "cmdline", "\0".join(argv) + "\0")
    write(base / "cgroup", cgroup)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    write(tmp_path / "etc/passwd", "root:x:0:0:root:/root:/bin/bash\n"
          "alice:x:7319:100::/home/alice:/bin/bash\nbob:x:2179:100::/home/bob:/bin/zsh\n")
    # The kubelet's pod log folders, <namespace>_<name>_<uid>, as on a node's /var/log.
    (tmp_path / "var/log/pods/ml-team_trainer-0_121157b5-c67d-4c3e-9052-cb27bbb711fb"
     ).mkdir(parents=True)
    (tmp_path / "var/log/pods/openshift-sdn_sdn-7x2_8ca306fa-3c03-47fa-97dd-19979c345572"
     ).mkdir(parents=True)
    proc(tmp_path, 4242, uid=7319, argv=["python3", "train.py", "--lr", "3e-4"],
         cgroup=(REAL / "slurm_v1_freezer_only.cgroup").read_text())
    proc(tmp_path, 4243, uid=2179, argv=["torchrun", "--nproc-per-node=8", "pretrain.py"],
         cgroup=(REAL / "slurm_v2_task.cgroup").read_text())
    proc(tmp_path, 5100, uid=0, argv=["python", "-m", "serve"],
         cgroup=(REAL / "k8s_containerd_v2_systemd.cgroup").read_text())
    proc(tmp_path, 5200, uid=1000650000, argv=["/usr/bin/infer"],
         cgroup=(REAL / "k8s_crio_v1_systemd.cgroup").read_text())
    return tmp_path


def gpus(host: Path, fake: FakeNvml) -> list[dict]:  # type: ignore[type-arg]
    c = GpuCollector(lambda: fake, FileTree(str(host)))
    c.start()
    values, _ = c.collect(now=1.0, wall=1000.0)
    return values


def test_each_gpu_lists_its_processes_with_user_command_memory_and_job(host: Path) -> None:
    fake = FakeNvml([
        FakeGpu(0, procs=[(4242, 30 * 2**30), (4243, 40 * 2**30)]),
        FakeGpu(1, procs=[(5100, 10 * 2**30), (5200, 2**30), (9999, 5 * 2**30)]),
        FakeGpu(2),
    ])
    values = gpus(host, fake)
    first = values[0]["processes"]
    assert [p["pid"] for p in first] == [4243, 4242]  # the largest memory user first
    assert first[0] == {"pid": 4243, "mem": 40 * 2**30, "user": "bob",
                        "command": "torchrun --nproc-per-node=8 pretrain.py", "job": "4"}
    assert first[1]["user"] == "alice" and first[1]["job"] == "748468"
    second = {p["pid"]: p for p in values[1]["processes"]}
    assert second[5100]["namespace"] == "ml-team" and second[5100]["pod"] == "trainer-0"
    assert second[5100]["runtime"] == "containerd" and second[5100]["user"] == "root"
    assert second[5200]["pod"] == "sdn-7x2" and second[5200]["runtime"] == "crio"
    assert second[5200]["user"] == "1000650000"  # a uid the host does not name
    # A pid NVML lists but /proc does not show (another pid namespace, or gone): kept,
    # with what NVML itself says.
    assert second[9999] == {"pid": 9999, "mem": 5 * 2**30}
    assert values[1]["procs"] == 3
    assert "processes" not in values[2]


def test_a_reused_pid_is_read_afresh_and_a_known_one_from_cache(host: Path) -> None:
    names = ProcessNames(FileTree(str(host)))
    assert names.describe(4242)["user"] == "alice"
    (host / "proc/4242/cmdline").write_text("changed\0")  # same process: cached
    assert names.describe(4242)["command"] == "python3 train.py --lr 3e-4"
    proc(host, 4242, uid=2179, argv=["bash"], cgroup="0::/user.slice\n", start=2000)
    # A known process's start time is checked every CHECK_EVERY samples, not each one.
    for _ in range(CHECK_EVERY - 1):
        names.end_sample()
        assert names.describe(4242)["user"] == "alice"
    names.end_sample()
    again = names.describe(4242)
    assert again["user"] == "bob" and again["command"] == "bash" and "job" not in again


def test_mig_instances_list_their_own_processes(host: Path) -> None:
    fake = FakeNvml([FakeGpu(0, mig=[FakeMig(gi=3, procs=[(5100, 3 * 2**30)]),
                                     FakeMig(gi=5)])])
    values = gpus(host, fake)
    mig = values[0]["mig"]
    assert mig[0]["processes"][0]["pod"] == "trainer-0"
    assert "processes" not in mig[1]


def test_garbage_under_proc_is_left_out_not_guessed(host: Path) -> None:
    write(host / "proc/4242/stat", "garbage")
    write(host / "proc/4242/status", "\xff\xfe no uid line")
    write(host / "proc/4242/cgroup", "::::\n\0")
    fake = FakeNvml([FakeGpu(0, procs=[(4242, 2**30)])])
    got = gpus(host, fake)[0]["processes"][0]
    assert got["pid"] == 4242 and got["mem"] == 2**30
    assert "user" not in got and "job" not in got
