"""Who runs on each GPU: the processes NVML lists, named from /proc, attributed to the
cluster's jobs from their cgroup.

For each process NVML reports on a GPU the agent reads, once per process (a pid is
known by its start time, so a reused pid is read afresh): its user (`status` Uid,
named from the host's /etc/passwd), its command line, and its cgroup, from which it
takes

- a Slurm job id: `/slurm/uid_1000/job_123/step_0` (cgroup v1) or
  `/system.slice/slurmstepd.scope/job_123/step_0/user/task_0` (v2);
- a Kubernetes pod uid and container id: `kubepods-burstable-pod<uid>.slice/
  cri-containerd-<id>.scope` (systemd driver), `/kubepods/burstable/pod<uid>/<id>`
  (cgroupfs driver), `crio-<id>.scope` (CRI-O), `docker-<id>.scope` (Docker); the
  pod's namespace and name from the kubelet's `/var/log/pods/<ns>_<name>_<uid>` folders
  when the host's /var/log is visible.

Everything is read through the agent's FileTree (`--root /host` in a container); what
cannot be read is left out, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agent.files import FileTree, ReadError

MAX_PER_GPU = 16  # the largest users of the GPU's memory; `procs` still counts them all
MAX_COMMAND = 160
_SLURM_JOB = re.compile(r"/job_(\d+)(?:/|$)")
# A pod's uid in its cgroup: a UUID (dashes, or underscores under the systemd driver),
# or the 32-hex hash a static pod (OpenShift's control plane) takes as uid.
_POD_UID = re.compile(r"[-/]pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}"
                      r"[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice|/|:|$)")
# A container's cgroup: `<runtime>-<id>.scope` (systemd driver), a bare id (cgroupfs
# driver, under /docker or a pod), or the colon form containerd writes when kubelet
# and containerd disagree on the driver: `<pod>.slice:cri-containerd:<id>`.
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker|libpod)[-:])?([0-9a-f]{64})"
                        r"(?:\.scope)?$")
_RUNTIMES = {"cri-containerd": "containerd", "libpod": "podman"}


@dataclass(slots=True)
class Attribution:
    job: str | None = None  # Slurm job id
    pod_uid: str | None = None
    container: str | None = None  # first 12 characters of the container id
    runtime: str | None = None  # containerd, crio, docker, podman


def _container(path: str) -> tuple[str, str | None] | None:
    """The innermost container on a cgroup path: a process may sit in a sub-cgroup
    below its container (kube-proxy does), and Docker-in-Docker nests two."""
    parts = path.split("/")
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        tail = part.split(":", 1)[1] if ":" in part else part  # the colon form
        found = _CONTAINER.match(tail)
        if found:
            runtime = found.group(1)
            if runtime is None and i > 0 and parts[i - 1] == "docker":
                runtime = "docker"
            return found.group(2)[:12], _RUNTIMES.get(runtime or "", runtime)
    return None


def parse_cgroup(text: str) -> Attribution:
    """A process's job and pod from the lines of its /proc/<pid>/cgroup (v1 or v2).

    Lines are `hierarchy:controllers:path`; the path may itself hold colons (the
    containerd colon form). Under cgroup v1 only some controllers may carry the job
    (Slurm's proctrack without task/cgroup puts just the freezer there), so every
    line is read and the first that names each thing wins."""
    out = Attribution()
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) < 3:
            continue
        path = fields[2].strip()
        if not path or path == "/":
            continue
        job = _SLURM_JOB.search(path)
        if job and out.job is None:
            out.job = job.group(1)
        pod = _POD_UID.search(path)
        if pod and out.pod_uid is None:
            out.pod_uid = pod.group(1).replace("_", "-")
        if out.container is None:
            found = _container(path)
            if found:
                out.container, out.runtime = found
    return out


def parse_status_uid(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) > 1 and fields[1].isdigit():
                return int(fields[1])
    return None


def parse_passwd(text: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].isdigit():
            out.setdefault(int(fields[2]), fields[0])
    return out


def _start_time(stat: str) -> str | None:
    """Field 22 of /proc/<pid>/stat (after the command in parentheses)."""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


# A process on a GPU is checked against its pid's start time every this many samples.
CHECK_EVERY = 10


class ProcessNames:
    """Per-process facts, cached by pid and start time."""

    def __init__(self, files: FileTree) -> None:
        self.files = files
        self._cache: dict[int, tuple[str | None, dict[str, Any]]] = {}
        self._users: dict[int, str] | None = None
        self._pods: dict[str, tuple[str, str]] | None = None
        self._pods_read = 0
        # The pids described since the last `end_sample`, and before it: each one's stat
        # is read through a kept descriptor, closed when the process leaves the GPUs.
        self._seen: set[int] = set()
        self._seen_before: set[int] = set()
        self._samples = 0
        self._checked: dict[int, int] = {}  # pid -> the sample its stat was last read

    def describe(self, pid: int) -> dict[str, Any]:
        # A process known a moment ago is taken to be the same process: its stat is read
        # again every CHECK_EVERY samples, not every second, so a pid reused within them
        # (the old process gone from the GPUs' lists and a new one on them under its pid)
        # shows the old one's description until then. The stat is read through a kept
        # descriptor, which answers for the process it was opened on: once that process
        # is gone the read fails (ESRCH) and the pid is opened afresh, a new process with
        # a new start time.
        self._seen.add(pid)
        cached = self._cache.get(pid)
        if cached is not None and self._samples - self._checked.get(pid, -CHECK_EVERY) \
                < CHECK_EVERY:
            return cached[1]
        self._checked[pid] = self._samples
        try:
            raw = self.files.read_counter(f"proc/{pid}/stat")
            start = _start_time(raw.decode("utf-8", errors="replace")
                                if isinstance(raw, bytes) else raw)
        except ReadError:
            return {}  # gone already, or in a pid namespace we cannot see
        cached = self._cache.get(pid)
        if cached is not None and cached[0] == start:
            return cached[1]
        info: dict[str, Any] = {}
        try:
            uid = parse_status_uid(self.files.read_text(f"proc/{pid}/status"))
        except ReadError:
            uid = None
        if uid is not None:
            info["user"] = self._user(uid)
        try:
            argv = self.files.read_text(f"proc/{pid}/cmdline").split("\0")
            command = " ".join(a for a in argv if a)
            if command:
                info["command"] = command[:MAX_COMMAND]
        except ReadError:
            pass
        try:
            where = parse_cgroup(self.files.read_text(f"proc/{pid}/cgroup"))
        except ReadError:
            where = Attribution()
        if where.job:
            info["job"] = where.job
        if where.pod_uid:
            info["pod_uid"] = where.pod_uid
            found = self._pod(where.pod_uid)
            if found:
                info["namespace"], info["pod"] = found
        if where.container:
            info["container"] = where.container
            if where.runtime:
                info["runtime"] = where.runtime
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[pid] = (start, info)
        return info

    def end_sample(self) -> None:
        """Close the descriptors of the processes no GPU lists any more."""
        for pid in self._seen_before - self._seen:
            self.files.forget(f"proc/{pid}/stat")
            self._checked.pop(pid, None)
        self._seen_before, self._seen = self._seen, set()
        self._samples += 1

    def _user(self, uid: int) -> str:
        if self._users is None:
            try:
                self._users = parse_passwd(self.files.read_text("etc/passwd"))
            except ReadError:
                self._users = {}
        return self._users.get(uid, str(uid))

    def _pod(self, uid: str) -> tuple[str, str] | None:
        # The kubelet's log folders name each pod: <namespace>_<name>_<uid>. Read again
        # when a pod is not found (new pods come), at most once per call.
        if self._pods is None or uid not in self._pods:
            self._pods = {}
            try:
                for entry in self.files.listdir("var/log/pods"):
                    parts = entry.rsplit("_", 2)
                    if len(parts) == 3:
                        self._pods[parts[2]] = (parts[0], parts[1])
            except ReadError:
                pass
        return self._pods.get(uid)


def processes(procs: list[Any], names: ProcessNames) -> list[dict[str, Any]]:
    """NVML's process list for one GPU, the largest memory users first, described."""
    rows = []
    for p in procs:
        mem = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) and \
            p.usedGpuMemory < 1 << 62 else None
        rows.append((mem or 0, p.pid, mem))
    rows.sort(key=lambda r: (-r[0], r[1]))
    out = []
    for _, pid, mem in rows[:MAX_PER_GPU]:
        entry: dict[str, Any] = {"pid": int(pid), "mem": mem}
        entry.update(names.describe(int(pid)))
        out.append(entry)
    return out
