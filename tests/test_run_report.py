"""`tuimon report`: a run's report from a judging relay's ledger, as Markdown for a ticket
and as one self-contained HTML file; the relay's endpoint and the ledger's SLI by period;
the renderers on hostile names; and the HTML looked at in a real headless browser."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import struct
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from agent.sim.cluster import SimCluster
from tests.conftest import run_tuimon
from tests.peers import free_port, require_chromium
from tuimon.model.cluster import ClusterState
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.job_report import job_report
from tuimon.model.judge_config import JudgeConfig
from tuimon.model.run_report import ReportError, run_report
from tuimon.model.slo import Slo
from tuimon.relay import Relay, RelayConfig
from tuimon.relay.fanout import FanOut
from tuimon.relay.ledger import Ledger
from tuimon.relay.report import report_document
from tuimon.text.job_text import job_text
from tuimon.ui.report_html import report_html
from tuimon.ui.report_markdown import report_markdown
from tuimon.ui.report_parts import when_text
from tuimon_core.findings import Finding

T0 = 1_800_000_000.0
SLO = Slo(0.9, 720)
HOSTILE = "<script>alert(1)</script>|x\ny"


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _document(job: str = "llm-pretrain", node: str = "gpu001", leaf: str = "leaf01"
              ) -> dict[str, Any]:
    """A relay's report of ten hours: an hour at 0.5, one not running, the rest at 0.9; a
    leaf congested for two hours; a node that throttled and was lost."""
    start = T0 - 10 * 3600
    totals = [3600.0] * 10
    totals[4] = 0.0
    effective = [3240.0] * 10
    effective[3], effective[4] = 1800.0, 0.0
    causes = {"comm": {f"congestion {leaf}": 3.0, f"thermal {node} GPU 1": 1.5},
              "stopped": {f"node lost {node}": 0.5}}
    return {
        "version": 1, "relay": "login1", "job": job, "generated_at": T0, "from": start,
        "until": T0,
        "summary": {"since": start, "window_h": 720.0, "consumed_h": 5.0,
                    "spent_h": {"comm": 4.5, "stopped": 0.5}, "observed_h": 9.0,
                    "error_ratio": {"5m": 0.1, "30m": 0.1, "1h": 0.1, "6h": 0.3,
                                    "1d": 0.5, "3d": 0.5},
                    "error": None, "causes_h": causes, "lost_from": start,
                    "lost_every_h": 1.0, "lost_h": [0.36, 0.36, 0.36, 1.5, 0.0, 0.36,
                                                    0.36, 0.86, 0.42, 0.42]},
        "sli": {"from": start, "every_s": 3600.0, "total_s": totals,
                "effective_s": effective},
        "incidents": [{"id": 7, "kind": "congestion", "severity": "warning",
                       "onset": T0 - 7 * 3600, "ended": T0 - 5 * 3600, "where": leaf,
                       "message": f"congestion concentrated under {leaf}",
                       "components": {"leaf": leaf, "nodes": "gpu[001-008]"},
                       "jobs": [job], "lost_h": 3.0, "flaps": 2}],
        "nodes": [{"node": node, "lost_h": 2.0, "causes": [f"thermal {node} GPU 1",
                                                            f"node lost {node}"],
                   "straggler": {"gpu": 1, "rank": 3, "ratio": 1.42,
                                 "message": f"{node} GPU 1 computes x1.42"}}],
        "leaves": [{"leaf": leaf, "now": [], "incidents": [7], "lost_h": 3.0}],
        "fleet": [{"aspect": "hca_fw:MT4126 InfiniBand", "message": f"HCA firmware: odd on "
                   f"{node}", "nodes": node, "job_nodes": node}],
        "job_nodes": "gpu[001-016]", "nodes_lost": [],
    }


def _pipes(line: str) -> int:
    """The column separators of a Markdown table line (a pipe not escaped)."""
    return len(re.findall(r"(?<!\\)\|", line))


def test_the_report_reads_every_part_of_the_relays_document() -> None:
    r = run_report(_document(), SLO)
    assert (r.budget.hours, r.budget.consumed_hours, r.budget.left_hours) == pytest.approx(
        (72.0, 5.0, 67.0))
    assert [(s.kind, s.hours) for s in r.spent] == [("comm", 4.5), ("stopped", 0.5)]
    assert [(c.kind, c.cause) for c in r.causes] == [
        ("comm", "congestion leaf01"), ("comm", "thermal gpu001 GPU 1"),
        ("stopped", "node lost gpu001")]
    assert [p.sli for p in r.sli][3:6] == [0.5, None, 0.9]  # a gap where it did not run
    assert r.sli_over == pytest.approx((8 * 3240 + 1800) / (9 * 3600))
    assert r.nodes[0].share == pytest.approx(2.0 / 5.0) and r.nodes[0].straggler_ratio == 1.42
    assert r.burn_down is not None and len(r.burn_down["left_hours"]) == 10
    for broken, part in (({"summary": None}, "summary"),
                         ({"sli": {"from": "x", "every_s": 1, "total_s": [],
                                   "effective_s": []}}, "sli.from"),
                         ({"incidents": [{"id": 1}]}, "incident")):
        with pytest.raises(ReportError, match=part):
            run_report({**_document(), **broken}, SLO)


def test_markdown_and_html_keep_hostile_names_text() -> None:
    """A job, a node, a leaf and a message named with a tag, a pipe and a newline: in the
    Markdown each is text in its own cell (no tag, no extra column, no broken line); in
    the HTML each is escaped, and nothing is fetched or run."""
    doc = _document(job=HOSTILE, node="gpu|1\n<b>", leaf="leaf`<i>`*_")
    doc["incidents"][0]["message"] = "[click](javascript:alert(1)) & <img src=x>"
    r = run_report(doc, SLO)
    md = report_markdown(r)
    assert not re.search(r"(?<!\\)[<>]", md)  # every angle bracket escaped: no tag
    assert "\\<script\\>alert(1)\\</script\\>\\|x\\\\x0ay" in md  # the name, as text
    for table in re.findall(r"(?:^\|.*\n)+", md, re.M):
        lines = table.splitlines()
        assert len({_pipes(line) for line in lines}) == 1, table  # no column added
    assert "| gpu\\|1\\\\x0a\\<b\\> |" in md
    html = report_html(r)
    assert "<script" not in html.lower() and "<img" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;|x\\x0ay" in html
    assert "&lt;img src=x&gt;" in html and "http://" not in html and "https://" not in html
    assert "<link" not in html and "@import" not in html and "url(" not in html


def test_the_report_says_the_budget_as_status_job_does(tmp_path: Path) -> None:
    """One ledger, one moment: the job's screen (`status --job`, from the relay's summary
    in a viewer) and the report (from the relay's endpoint) say the same budget, the
    same hours spent by kind and by cause, and the same burn-down."""
    wall = Clock(T0)
    ledger = Ledger(tmp_path / "l.db", clock=wall, window_hours=48)
    leaf = Finding("warning", "congestion", "congestion concentrated under leaf01",
                   leaf="leaf01", nodes=("n1", "n2"), score=1.0, first_seen=T0)
    ledger.observe([leaf], T0, lambda f: ["job"])
    for hour in range(12):  # half a day at SLI 0.9, the comm under the leaf
        ledger.add("job", T0 + 3600 * hour + 3599, 3600.0, 3240.0, {"comm": 300.0})
        ledger.attribute(lambda job: [leaf])
    wall.t = T0 + 12 * 3600
    ledger.observe([leaf], wall.t, lambda f: ["job"])
    slo = Slo(0.9, 48)
    cluster = ClusterState()
    cluster.apply_budget(ledger.summary(wall.t), "relay")
    eff = EfficiencyView(slo, wall=wall)
    eff.update(cluster)
    screen = job_text(job_report(eff, "job", []), 120, plain=True)
    doc = report_document(ledger, FanOut(), "relay", "job", 86400.0, wall.t)
    assert doc is not None
    md = report_markdown(run_report(doc, slo))
    budget = next(line for line in screen.splitlines() if line.startswith("budget"))
    assert budget.split(None, 1)[1] + "." in md, (budget, md)  # 3.6 of 4.8 h left ...
    # Under an hour, minutes, on the screen as in the report.
    for kind, hours, share in (("comm", "1.0 h", "83%"), ("other", "12 min", "17%")):
        assert re.search(rf"^  {kind} +{hours} +{share}  ", screen, re.M), screen
        assert f"| {kind} | {hours} | {share} |" in md
    assert "| comm | congestion leaf01 | 1.0 h | 100% |" in md
    assert "SLI 0.90 over 12.0 h of run time" in md
    # The incident is the ledger's, with the cost it put down to it.
    assert f"| {when_text(T0, seconds=True)} | 12.0 h, holds | warning | congestion leaf01 |" \
        in md
    assert "| leaf01 | \\#1 | 1.2 h |" in md
    assert report_document(ledger, FanOut(), "relay", "other", 86400.0, wall.t) is None
    ledger.close()


def test_the_ledgers_sli_by_period_adds_up_to_its_summary(tmp_path: Path) -> None:
    """The periods are the shortest that give at most 240 (minutes for a short run, hours
    for nine days, three hours for a month), and their sums are the summary's: the file's
    minutes, those not written yet, and a stop's lost time as it stands."""
    wall = Clock(T0)
    ledger = Ledger(tmp_path / "l.db", clock=wall, window_hours=24 * 40)
    for minute in range(30):
        ledger.add("job", T0 + 60 * minute + 30, 60.0, 54.0)
    assert ledger.flush()
    ledger.add("job", T0 + 60 * 30 + 30, 60.0, 30.0)  # not written yet
    wall.t = T0 + 60 * 31
    series = ledger.sli_series("job", T0 - 86400, wall.t)
    assert series is not None and series.every_s == 60.0
    assert series.total_s[:2] == [60.0, 60.0] and series.effective_s[-2] == 30.0
    summary = ledger.summary(wall.t)["job"]
    assert sum(series.total_s) == pytest.approx(summary["observed_h"] * 3600)
    wall.t = T0 + 60 * 40  # silent past its time: stopped, its lost time counts now
    ledger.note_stops(wall.t, lambda job: "node lost n1")
    wall.t = T0 + 86400 * 9
    series = ledger.sli_series("job", T0 - 3600, wall.t)
    summary = ledger.summary(wall.t)["job"]
    assert series is not None and series.every_s == 3600.0 and len(series.total_s) <= 240
    assert sum(series.total_s) == pytest.approx(summary["observed_h"] * 3600)
    assert sum(series.total_s) - sum(series.effective_s) == pytest.approx(
        summary["consumed_h"] * 3600)
    wall.t = T0 + 86400 * 29
    series = ledger.sli_series("job", T0 - 3600, wall.t)
    assert series is not None and series.every_s == 3 * 3600.0
    assert ledger.sli_series("job", T0 - 7200, T0 - 3600) is None  # bounded on both sides
    assert ledger.sli_series("nobody", T0 - 3600, wall.t) is None
    ledger.close()


def test_the_summary_gives_the_job_a_report_asks_for_in_full(tmp_path: Path) -> None:
    """The summary sends its causes and history for the most recent jobs only; a report
    asks for one job, which has them however many jobs ran since."""
    from tuimon_core.protocol.fields import MAX_DETAILED_JOBS

    wall = Clock(T0)
    ledger = Ledger(tmp_path / "l.db", clock=wall)
    ledger.add("old", T0 + 30, 60.0, 30.0)
    for i in range(MAX_DETAILED_JOBS):
        ledger.add(f"job{i}", T0 + 90 + 60 * i, 60.0, 30.0)
    wall.t = T0 + 60 * (MAX_DETAILED_JOBS + 2)
    assert "lost_h" not in ledger.summary()["old"]
    assert ledger.summary(job="old")["old"]["lost_h"] == [pytest.approx(30 / 3600)]
    assert "nobody" not in ledger.summary(job="nobody")
    ledger.close()

def _cost_s(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


async def test_the_report_of_a_run_under_a_judging_relay(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    """The seed incident (a leaf loses spine capacity a few seconds in) under a real
    relay that judges with the topology and keeps a ledger, behind a token: `tuimon
    report` in Markdown lists the leaf's incident with its onset and its cost, puts the
    budget down to the leaf, plots the SLI; the HTML (format from -o's suffix) has the
    plots as inline SVG, no script and no link out. A wrong token, a job the ledger does
    not count and a relay that is not there are UNKNOWN (3) with the reason; an -o whose
    suffix names no format is a usage error (2)."""
    sim = SimCluster(nodes=16, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="spine-imbalance", fault_at=3.0)
    leaf = sim.truth()["components"][0]
    job = sim.job.name
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-the-relay\n")
    token.chmod(0o600)
    topology = {m.name: sim.leaf_of(m.index) for m in sim.members}
    config = RelayConfig(targets=sim.targets, listen="127.0.0.1:0", interval=0.2,
                         upstream_backoff=(0.1, 0.5), ledger=tmp_path / "ledger.db",
                         flush_every=0.5, token="s3cret-token-for-the-relay",
                         judge=JudgeConfig(topology=topology))

    def cost(relay: Relay) -> float:
        ledger = relay.state.ledger
        assert ledger is not None
        found = [e for e in ledger.incidents(0.0, job=job) if e.key == f"congestion {leaf}"]
        return found[0].lost_s if found else 0.0

    async with sim, Relay(config) as relay:
        deadline = time.monotonic() + 60
        while cost(relay) <= 0:
            assert time.monotonic() < deadline, "the leaf's incident never cost the job"
            await asyncio.sleep(0.5)
        await asyncio.sleep(6.0)  # a few flushes of the leaf costing the job
        address = f"127.0.0.1:{relay.port}"
        common = ("--relay", address, "--job", job, "--token-file", str(token))
        before = cost(relay)
        code, md = await run_tuimon("report", *common)
        after = cost(relay)
        ledger = relay.state.ledger
        assert ledger is not None
        [incident] = [e for e in ledger.incidents(0.0, job=job)
                      if e.key == f"congestion {leaf}"]
        page = tmp_path / "run.html"
        html_code, html_out = await run_tuimon("report", *common, "-o", str(page))
        refused = await run_tuimon("report", "--relay", address, "--job", job)
        unknown = await run_tuimon("report", *common[:2], "--job", "nope", *common[4:])
    assert code == 0, md
    row = next(line for line in md.splitlines() if f"| congestion {leaf} |" in line
               and line.startswith(f"| {when_text(incident.onset, seconds=True)} |"))
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
    assert before - 1 <= _cost_s(cells[5]) <= after + 1, (cells, before, after)
    assert cells[1].endswith("holds") and cells[2] == "warning", cells
    assert re.search(rf"^\| comm \| congestion {leaf} \| [0-9.]+ (s|min|h) \| \d+% \|$",
                     md, re.M), md
    assert re.search(r"^1\.00 \u2502[\u2581-\u2588 ]*[\u2581-\u2588]", md, re.M), md
    assert html_code == 0, html_out
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and f"congestion {leaf}" in html
    sli = re.search(r'<svg id="sli-plot".*?</svg>', html, re.S)
    assert sli is not None and "<circle" in sli.group(0)
    assert re.search(r"<svg[^>]*>.*<(polyline|path)\b", html, re.S)
    assert "<script" not in html.lower() and not re.search(r"https?://", html)
    assert refused[0] == 3 and "wrong or missing token (401)" in refused[1], refused
    assert unknown[0] == 3 and "no job 'nope' in this relay's ledger" in unknown[1] and \
        f"(jobs: {job})" in unknown[1], unknown
    gone = await run_tuimon("report", "--relay", f"127.0.0.1:{free_port()}", "--job", job)
    assert gone[0] == 3 and "UNKNOWN: relay 127.0.0.1:" in gone[1], gone
    usage = await run_tuimon("report", "--relay", "127.0.0.1:1", "--job", job, "-o",
                             str(tmp_path / "run.txt"))
    assert usage[0] == 2 and "give --format markdown or html" in usage[1], usage


# -- the HTML in a real browser ---------------------------------------------------------

def _png_rows(path: Path, most: int) -> list[bytes]:
    """The first `most` rows of an 8-bit RGB(A) PNG, unfiltered (standard library only)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, [], b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat.append(body)
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 4 if color == 6 else 3
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    rows, prev = [], bytearray(stride)
    for y in range(min(height, most)):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:
                                                          (y + 1) * (stride + 1)])
        if kind == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif kind in (1, 3, 4):
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                up, corner = prev[i], prev[i - bpp] if i >= bpp else 0
                if kind == 1:
                    guess = left
                elif kind == 3:
                    guess = (left + up) // 2
                else:
                    p = left + up - corner
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                    guess = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + guess) & 255
        rows.append(bytes(line) if bpp == 3 else
                    bytes(b for i in range(0, stride, bpp) for b in line[i:i + 3]))
        prev = line
    return rows


def _screenshot(browser: str, tmp: Path, name: str, html: str) -> Path:
    """The page as headless Chromium draws it at 1200x1600; every process it started is
    gone when this returns."""
    page, png = tmp / f"{name}.html", tmp / f"{name}.png"
    page.write_text(html)
    proc = subprocess.Popen(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
         "--hide-scrollbars", f"--user-data-dir={tmp / 'profile'}",
         f"--screenshot={png}", "--window-size=1200,1600", page.as_uri()],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "HOME": str(tmp)})
    try:
        proc.wait(90)
    finally:
        # Its renderer and helpers are in its session: none is left behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert png.exists(), f"chromium drew no {png.name}"
    return png


def test_the_html_report_shows_its_plot_in_a_real_browser(tmp_path: Path) -> None:
    """Debian's Chromium, headless, draws the report; the same page with the SLI plot's
    drawing taken out (its box kept, so nothing else moves) differs from it where the
    plot is, by the plot's line and dots: the SVG is drawn, not just present."""
    browser = require_chromium()
    html = report_html(run_report(_document(), SLO))
    empty, n = re.subn(r'(<svg id="sli-plot"[^>]*>).*?(</svg>)', r"\1\2", html, flags=re.S)
    assert n == 1
    rows = 900  # the plot is near the top: the rows below it need not be read
    drawn = _png_rows(_screenshot(browser, tmp_path, "drawn", html), rows)
    blank = _png_rows(_screenshot(browser, tmp_path, "blank", empty), rows)
    changed = [y for y in range(rows) if drawn[y] != blank[y]]
    assert changed, "the SLI plot drew nothing"
    dark = sum(1 for y in changed for x in range(0, len(drawn[y]), 3)
               if drawn[y][x:x + 3] != blank[y][x:x + 3] and max(drawn[y][x:x + 3]) < 128)
    # Ten hourly periods: nine dots, two runs of line, the axes and the target's dashes.
    assert dark > 1500, dark
    assert changed[0] > 150 and changed[-1] - changed[0] < 400, (changed[0], changed[-1])
