"""Each rule written once: the places that restated a rule (and some disagreed) now read
it from its owner. A grep can say so for literals; the job's findings are checked by
behaviour."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuimon.model.efficiency import EfficiencyView
from tuimon.model.job_report import job_report
from tuimon_core.findings import KINDS, Finding

ROOT = Path(__file__).resolve().parent.parent
CODE = [p for folder in ("agent", "tuimon", "tuimon_core") for p in (ROOT / folder).rglob("*.py")]

PORT_HEALTH = r"\bPORT_(ACTIVE|LINK_UP)\b"
# A node's state compared, set or counted by its name, or the states listed.
NODE_STATES = (r'(\.(status|state) *(==|!=|=)|\b(status|state) *(==|!=)) *'
               r'"(up|stale|down|connecting|unknown)"'
               r'|"(up|stale|down|unknown)": "\$'
               r'|\b(state|status) (not )?in \("(up|stale|down)"'
               r"|\b(c|n|counts)\[['\"](up|stale|down|unknown|connecting)['\"]\]"
               r'|"(connecting|up|stale|down|unknown)": 0\b'
               r'|_set_state\([^)]*"(up|stale|down|connecting)"'
               r'|(state|status): str = "connecting"|return "(stale|down)" if'
               r'|\("(connecting|up)", "(up|stale)"|frozenset\(\{"(stale|down)"')
# Finding kinds listed: a set of them (a line of several, or its start), or a kind's
# timing or words by name.
_KIND = "|".join(sorted(KINDS, key=len, reverse=True))
FINDING_KINDS = (rf'(frozenset\(\{{|^)\s*"({_KIND})", "({_KIND})"'
                 rf'|"({_KIND})": (Timing\(|"(?!({_KIND})")[^"]*")')
AGENT_METRICS = (r"tuimon_gpu_up\b|tuimon_gpu_(sm|memory)_clock_max_hertz"
                 r"|tuimon_gpu_pcie_link_(generation|width)_max|tuimon_gpu_nvlinks"
                 r"|tuimon_hca_pcie_link")

# pattern -> (what it is, the one file that may write it)
ONCE = {
    r"(default=|Slo\()0\.90?\b": ("the SLO target's default", "tuimon/model/slo.py"),
    r"(default=|hours: float = |Slo\([^)]*, )720(\.0)?\b": ("the SLO window's default",
                                                          "tuimon/model/slo.py"),
    r'"5m", "30m", "1h"': ("the burn windows", "tuimon/model/slo.py"),
    r"0\.9 \* prov": ("near the provisioned throughput", "tuimon/model/storage.py"),
    r'"critical": "\$error"': ("a severity's colour", "tuimon/text/severity.py"),
    r"interval: float = 0\.(25|5)\b|default=0\.25": ("the relay's batch interval",
                                                   "tuimon/relay/server.py"),
    r"min\(1\.0, [a-z_\[\]\"]*bytes_s|_bytes_s\"\] / rate": (
        "a link's utilisation", "tuimon_core/protocol/fields.py"),
    PORT_HEALTH: ("whether a port is healthy (ACTIVE and LinkUp: port_down, PORT_HEALTHY)",
                  "tuimon_core/protocol/fields.py"),
    NODE_STATES: ("a node's state names", "tuimon_core/node_states.py"),
    r"\.owner (=|==) relay\b": ("who may speak for a node (the relay trust rule, may_carry)",
                                "tuimon_core/identity.py"),
    r"rank_where\.values\(\)": ("a job's nodes (JobState.nodes)", "tuimon/model/efficiency.py"),
    FINDING_KINDS: ("the finding kinds and what each is (KINDS)", "tuimon_core/findings.py"),
    r'for [a-z_]+, fstype, |\[f\["id"\], f\.get\("fstype"\)': (
        "the file-system row's column order (FS_ROW_FIELDS)", "tuimon_core/protocol/fields.py"),
    AGENT_METRICS: ("the /metrics names of a GPU's facts and up, and of an HCA's link",
                    "tuimon_core/protocol/fields.py"),
    r"^SHARED_FSTYPES\b": ("the shared file system types (a regex of them is named so no "
                           "more)", "tuimon_core/filesystems.py"),
}


def _written(pattern: str) -> dict[str, list[str]]:
    """file -> its lines (numbered) that match, comments left out."""
    out: dict[str, list[str]] = {}
    for p in CODE:
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(pattern, line) and not line.lstrip().startswith("#"):
                out.setdefault(str(p.relative_to(ROOT)), []).append(f"{i}: {line.strip()}")
    return out


@pytest.mark.parametrize("pattern", list(ONCE), ids=[what for what, _ in ONCE.values()])
def test_a_rule_is_written_by_its_owner_only(pattern: str) -> None:
    what, owner = ONCE[pattern]
    found = [f"{path}:{line}" for path, lines in _written(pattern).items()
             if path != owner for line in lines]
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


@pytest.mark.parametrize("state, phys", [(4, 2), (None, 3), (1, 5), (4, None)])
def test_every_reader_says_the_same_of_a_ports_health(state: int | None,
                                                      phys: int | None) -> None:
    """The node rules, the map's errors level and the readout's count of bad ports read
    one rule (port_down). The maps, the node screen and the readout once read the state
    alone: an ACTIVE port whose link was Polling (or, through Prometheus, whose state
    came unread for it is asked only when not ACTIVE) was a red link_down to the rules
    and a healthy cell on the map."""
    from tuimon.model.node_state import NodeState
    from tuimon.readout import node_row
    from tuimon_core.heat_levels import FABRIC_METRICS, LEVELS
    from tuimon_core.node_rules import NodeRules
    from tuimon_core.node_states import UP
    from tuimon_core.protocol import Sample
    from tuimon_core.protocol.fields import port_down

    port = {"id": "mlx5_0:1", "state": state, "phys_state": phys}
    down = port_down(state, phys)
    assert down == ((state is not None and state != 4) or phys not in (None, 5))
    sample = Sample(1, 0.0, 1.0, gpus=[], extra={"fabric": {"ports": [port]}})
    rules = NodeRules("gpu001")
    rules.observe(None, sample, 0.0)
    raised = {f.kind for f in rules.conditions(0.0)} & {"link_down", "port_disabled"}
    assert bool(raised) == down, raised
    errors = next(m for m in FABRIC_METRICS if m.key == "errors")
    assert (errors.level(port) == LEVELS - 1) == down
    node = NodeState("gpu001:9477", "gpu001", sample=sample, detail=sample, status=UP)
    assert node_row(node, 0.0).split()[-1] == str(int(down))


def test_every_kind_a_rule_raises_is_listed_once() -> None:
    """A finding's kind, where a rule names it, is one of KINDS: its timing, its words
    for a group of nodes and what the viewer makes of it are read there."""
    raised = {m.group(1) for p in CODE for m in re.finditer(
        r'Finding\(\s*(?:"[a-z]+"(?: if [^,]+ else "[a-z]+")?|[a-z_.]+),\s*"([a-z_]+)"',
        p.read_text())}
    assert len(raised) > 30 and raised <= set(KINDS), sorted(raised - set(KINDS))
