"""The real peers tests run on loopback (Debian's prometheus, promtool, alertmanager and
victoria-metrics) and the browser the run report is looked at in (chromium): finding
them, and starting a server that is ready before the test goes on."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
VICTORIA_METRICS = shutil.which("victoria-metrics")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
AMTOOL = shutil.which("amtool")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _require(found: str | None, name: str, package: str) -> str:
    """A peer's binary, or a skip saying why (a failure under CI, which installs it)."""
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} not found: CI installs it (apt-get install {package})")
        pytest.skip(f"{name} not installed (apt-get install {package}); CI installs it")
    return found


def require_prometheus() -> str:
    return _require(PROMETHEUS, "prometheus", "prometheus")


def require_promtool() -> str:
    return _require(PROMTOOL, "promtool", "prometheus")


@contextlib.contextmanager
def _serving(name: str, argv: list[str], log: Path, ready: str, url: str) -> Iterator[str]:
    """Run a server, yield `url` once `ready` answers 200; its log's tail if it dies."""
    with log.open("wb") as err:  # a file, not a pipe: nobody reads it while it runs
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(ready, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"{name} did not start: " + (
                    log.read_text(errors="replace")[-2000:] if proc.poll() is not None
                    else "timed out"))
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def running_prometheus(tmp: Path, scrape_configs: str, every: float = 1.0,
                       rules: str = "", alertmanager: str | None = None) -> Iterator[str]:
    """A real Prometheus on loopback, scraping and evaluating every `every` seconds, with
    these `scrape_configs` entries (YAML) and this rule file (YAML, where given), sending
    its alerts to `alertmanager` (host:port, where given); yields its URL once /-/ready
    answers."""
    assert PROMETHEUS is not None, "CI must install prometheus (apt-get install prometheus)"
    port = free_port()
    config = tmp / "prometheus.yml"
    rule_files = ""
    if rules:
        (tmp / "rules.yml").write_text(rules)
        rule_files = f"rule_files: [{json.dumps(str(tmp / 'rules.yml'))}]\n"
    alerting = ("alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: "
                f"[{json.dumps(alertmanager)}]\n" if alertmanager else "")
    config.write_text(f"global:\n  scrape_interval: {every:g}s\n  evaluation_interval: "
                      f"{every:g}s\n  scrape_timeout: {min(every, 10):g}s\n" + rule_files
                      + alerting + "scrape_configs:\n" + scrape_configs)
    url = f"http://127.0.0.1:{port}"
    with _serving("prometheus", [
            PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            tmp / "prometheus.log", f"{url}/-/ready", url) as served:
        yield served


def require_alertmanager() -> str:
    return _require(ALERTMANAGER, "alertmanager", "prometheus-alertmanager")


@contextlib.contextmanager
def running_alertmanager(tmp: Path, webhook: str) -> Iterator[str]:
    """A real Alertmanager on loopback, its clustering off, sending every alert at once
    (group_wait 1 s) to the webhook receiver at `webhook` (a URL); yields host:port."""
    binary = require_alertmanager()
    port = free_port()
    config = tmp / "alertmanager.yml"
    config.write_text(
        "route:\n  receiver: hook\n  group_by: ['alertname', 'kind', 'component']\n"
        "  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n"
        f"receivers:\n  - name: hook\n    webhook_configs:\n      - url: {json.dumps(webhook)}\n"
        "        send_resolved: true\n")
    address = f"127.0.0.1:{port}"
    with _serving("alertmanager", [
            binary, f"--config.file={config}", f"--storage.path={tmp / 'am'}",
            f"--web.listen-address={address}", "--cluster.listen-address=",
            "--log.level=warn"],
            tmp / "alertmanager.log", f"http://{address}/-/ready", address) as served:
        yield served


def require_amtool() -> str:
    return _require(AMTOOL, "amtool", "prometheus-alertmanager")


def require_chromium() -> str:
    return _require(CHROMIUM, "chromium", "chromium")


def require_victoria_metrics() -> str:
    return _require(VICTORIA_METRICS, "victoria-metrics", "victoria-metrics")


@contextlib.contextmanager
def running_victoria_metrics(tmp: Path, scrape_configs: str,
                             every: float = 1.0) -> Iterator[str]:
    """A real VictoriaMetrics single-node on loopback, scraping every second with these
    `scrape_configs` entries (its defaults otherwise: the newest 30 s hidden from
    queries, -search.latencyOffset); yields its URL once /health answers."""
    binary = require_victoria_metrics()
    port = free_port()
    config = tmp / "scrape.yml"
    config.write_text(f"global:\n  scrape_interval: {every:g}s\nscrape_configs:\n"
                      + scrape_configs)
    url = f"http://127.0.0.1:{port}"
    with _serving("victoria-metrics", [
            binary, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={tmp / 'vmdata'}",
            f"-promscrape.config={config}", "-loggerLevel=ERROR"],
            tmp / "victoria-metrics.log", f"{url}/health", url) as served:
        yield served
