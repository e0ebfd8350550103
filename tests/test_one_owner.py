"""Each rule written once: the places that restated a rule (and some disagreed) now read
it from its owner. A grep can say so for literals; the job's findings are checked by
behaviour."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuimon.model.efficiency import EfficiencyView
from tuimon.model.job_report import job_report
from tuimon_core.findings import Finding

ROOT = Path(__file__).resolve().parent.parent
CODE = [p for folder in ("agent", "tuimon", "tuimon_core") for p in (ROOT / folder).rglob("*.py")]

# pattern -> (what it is, the one file that may write it)
ONCE = {
    r"(default=|Slo\()0\.90?\b": ("the SLO target's default", "tuimon/model/slo.py"),
    r"(default=|hours: float = |Slo\([^)]*, )720(\.0)?\b": ("the SLO window's default",
                                                          "tuimon/model/slo.py"),
    r'"5m", "30m", "1h"': ("the burn windows", "tuimon/model/slo.py"),
    r"0\.9 \* prov": ("near the provisioned throughput", "tuimon/model/storage.py"),
    r'"critical": "\$error"': ("a severity's colour", "tuimon/ui/severity.py"),
    r"interval: float = 0\.(25|5)\b|default=0\.25": ("the relay's batch interval",
                                                   "tuimon/relay/server.py"),
    r"min\(1\.0, [a-z_\[\]\"]*bytes_s|_bytes_s\"\] / rate": (
        "a link's utilisation", "tuimon_core/protocol/fields.py"),
}


@pytest.mark.parametrize("pattern", list(ONCE))
def test_a_rule_is_written_by_its_owner_only(pattern: str) -> None:
    what, owner = ONCE[pattern]
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in CODE
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(pattern, line) and not line.lstrip().startswith("#")
             and str(p.relative_to(ROOT)) != owner]
    assert found == [], f"{what} written outside {owner}: {found}"


def test_a_jobs_findings_are_those_its_waiting_is_put_down_to() -> None:
    """The job's screen lists what concerns the job, by the attribution's rule: its own
    findings, its nodes', the cluster's (a file system); not another job's straggler on a
    node the two share."""
    eff = EfficiencyView(wall=lambda: 1000.0)
    job = eff._job("train")
    job.rank_where = {0: ("gpu001", 0), 1: ("gpu002", 0)}
    findings = [
        Finding("warning", "thermal", "gpu001 GPU 0 hot", node="gpu001", gpu=0, score=0.5),
        Finding("warning", "storage", "/lustre at 95%", fs="/lustre", score=0.7),
        Finding("warning", "straggler", "gpu002 GPU 1 (rank 3 of other)", node="gpu002",
                gpu=1, job="other", score=0.7),
        Finding("warning", "thermal", "gpu009 GPU 0 hot", node="gpu009", gpu=0, score=0.5),
    ]
    shown = [f["message"] for f in job_report(eff, "train", findings)["findings"]]
    assert shown == ["gpu001 GPU 0 hot", "/lustre at 95%"]
