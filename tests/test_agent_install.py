"""The agent-only install: a wheel built from packaging/tuimon-agent, installed into a
fresh virtual environment that has the agent's dependencies and no Textual, imports
every agent module and serves.

Offline: the wheel is built with the hatchling of the test environment, and the
dependencies are the test environment's own installed packages, offered to the new
environment through a .pth file, minus the viewer's (textual, rich and theirs)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.conftest import write_proc

ROOT = Path(__file__).resolve().parent.parent
VIEWER_ONLY = ("textual", "rich", "pygments", "markdown_it", "mdurl", "linkify_it",
               "uc_micro", "mdit_py_plugins", "platformdirs", "msgspec")
OURS = ("agent", "tuimon", "tuimon_core", "__editable__", "_tuimon", "tuimon-")


@pytest.fixture(scope="module")
def agent_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling", reason="hatchling (the test extra) builds the wheel")
    work = tmp_path_factory.mktemp("agent-install")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--no-build-isolation", str(ROOT / "packaging" / "tuimon-agent"), "-w",
         str(work / "dist")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (work / "dist").glob("tuimon_agent-*.whl")
    env = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True,
                   timeout=120)
    site = Path(subprocess.run(
        [str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
         "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    # This environment's pip installs into the new one (scripts with its interpreter).
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install",
         "--quiet", "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True,
        timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # The dependencies: this environment's packages, without the viewer's or ours.
    deps = work / "deps"
    deps.mkdir()
    here = Path(sysconfig.get_paths()["purelib"])
    for entry in here.iterdir():
        name = entry.name
        if name.endswith(".pth") or name.startswith(OURS) or \
                name.split("-")[0].split(".")[0].lower() in VIEWER_ONLY:
            continue
        (deps / name).symlink_to(entry)
    (site / "deps.pth").write_text(f"{deps}\n")
    return env


def _py(env: Path, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(env / "bin" / "python"), *args], capture_output=True,
                          text=True, timeout=120, env=clean, cwd="/", **kw)  # type: ignore[call-overload]


def test_the_agent_wheel_holds_the_agent_and_what_is_shared_only(agent_env: Path) -> None:
    (wheel,) = (agent_env.parent / "dist").glob("tuimon_agent-*.whl")
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
        meta = next(z.read(n).decode() for n in z.namelist() if n.endswith("METADATA"))
    assert {t for t in tops if not t.endswith(".dist-info")} == {"agent", "tuimon_core"}
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and not any("textual" in r or "rich" in r for r in requires)


def test_every_agent_module_imports_without_textual(agent_env: Path) -> None:
    code = ("import importlib, pkgutil, sys, agent, tuimon_core\n"
            "try:\n    import textual\nexcept ImportError:\n    pass\n"
            "else:\n    sys.exit('textual is importable: the test proves nothing')\n"
            "names = []\n"
            "for pkg in (agent, tuimon_core):\n"
            "    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
            "        if not info.name.endswith('__main__'):\n"
            "            importlib.import_module(info.name); names.append(info.name)\n"
            "print(len(names), agent.__file__)\n")
    out = _py(agent_env, "-c", code)
    assert out.returncode == 0, out.stderr
    count, where = out.stdout.split()
    assert int(count) > 30 and str(agent_env) in where  # the installed copy, not the tree


def test_the_installed_agent_reads_a_node_and_serves(agent_env: Path, tmp_path: Path) -> None:
    script = agent_env / "bin" / "tuimon-agent"
    assert script.exists()
    once = subprocess.run([str(script), "once", "--json", "--interval", "0.2", "--root",
                           str(write_proc(tmp_path)), "--node-name", "n1"],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert once.returncode == 0, once.stderr
    assert json.loads(once.stdout)["node"] == "n1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(script), "run", "--listen", f"127.0.0.1:{port}",
                             "--no-steps", "--root", str(write_proc(tmp_path / "b"))],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz",
                                            timeout=2) as r:
                    health = json.loads(r.read())
                # It serves before its first sample is taken ("starting"): a loaded
                # machine can see that moment.
                if health["status"] != "starting" or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "the installed agent did not serve"
                time.sleep(0.2)
        assert health["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_agent_alias_for_the_relay_says_where_it_went(agent_env: Path) -> None:
    out = subprocess.run([str(agent_env / "bin" / "tuimon-agent"), "relay", "gpu001"],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 2
    assert "`tuimon relay`" in out.stderr and "pip install tuimon" in out.stderr

