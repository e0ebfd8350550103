"""The Prometheus rules for the training SLO, checked by the real promtool.

Each scenario is one set of step counters, given three ways: to promtool as input series,
to the app's own BurnTracker minute by minute, and as the alerts a person expects at a
few times. The test asserts the app agrees with the person, then has promtool assert the
rules fire exactly what the app fires, labels and rendered annotations included.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.peers import require_promtool
from tuimon.model.prom_rules import ALERT, WAIT_WINDOWS, rules_yaml, wait_share_record
from tuimon.model.slo import (
    ABOVE,
    ALERTS,
    BURN_WINDOWS_S,
    COVERED_TO_ALERT,
    BurnTracker,
    Slo,
)

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = (0.97, 0.97)  # compute fraction of each of two ranks
HALF = (0.4, 0.6)  # the job computes 50% of the time, its ranks unevenly


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_promtool()


def run_promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def assert_ok(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, (f"{' '.join(done.args)} exited {done.returncode}\n"
                                  f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}")


# -- reading the generated file back (no YAML library: the format is our own) ---------


@dataclass
class Rule:
    kind: str  # "record" or "alert"
    name: str
    expr: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


def parse_rules(text: str) -> list[Rule]:
    rules: list[Rule] = []
    section = ""
    for line in text.splitlines():
        if m := re.fullmatch(r" {6}- (record|alert): (\".*\")", line):
            rules.append(Rule(m[1], json.loads(m[2])))
        elif line.startswith(" " * 8) and not line.startswith(" " * 9):
            section = line.strip().split(":")[0]
        elif line.startswith(" " * 10) and rules:
            if section == "expr":
                rules[-1].expr.append(line[10:])
            else:
                key, value = line.strip().split(": ", 1)
                getattr(rules[-1], section)[key] = json.loads(value)
    return rules


def alerts_of(text: str) -> list[Rule]:
    """The SLO's burn alerts (the findings' alert is its own group's)."""
    return [r for r in parse_rules(text) if r.kind == "alert" and r.name == ALERT]


def render(template: str, job: str, value: float) -> str:
    """What Prometheus' template engine makes of our annotation templates."""
    out = (template.replace("{{ or $labels.exported_job $labels.job }}", job)
           .replace("{{ $labels.job }}", job)
           .replace('{{ $value | printf "%.1f" }}', f"{value:.1f}")
           .replace('{{ $value | printf "%.2f" }}', f"{value:.2f}"))
    assert "{{" not in out, out
    return out


# -- scenarios -----------------------------------------------------------------------


@dataclass
class Job:
    series: dict[str, str]  # labels of its counters, as scraped (ranks added)
    out: dict[str, str]  # labels the rules' results carry
    name: str  # the job's name in annotations
    # (minutes, compute fraction of each rank); None: no steps (wall time stands still)
    phases: list[tuple[int, tuple[float, ...] | None]]


def counter_values(increments: list[float]) -> str:
    """promtool's expanding notation, one sample a minute from 0. promtool expands `a+bxn`
    by adding b n times; the next run starts from the same float sum, so a counter never
    steps back by a rounding error (which rate() would read as a reset)."""
    parts, total, i = ["0"], 0.0, 0
    while i < len(increments):
        j = i
        while j < len(increments) and increments[j] == increments[i]:
            j += 1
        step, start = increments[i], total + increments[i]
        parts.append(f"{start!r}+{step!r}x{j - i - 1}")
        total = start
        for _ in range(j - i - 1):
            total += step
        i = j
    return " ".join(parts)


def input_series(job: Job) -> list[dict[str, str]]:
    ranks = len(next(f for _, f in job.phases if f is not None))
    out = []
    for rank in range(ranks):
        wall: list[float] = []
        compute: list[float] = []
        for minutes, fractions in job.phases:
            wall += [0.0 if fractions is None else 60.0] * minutes
            compute += [0.0 if fractions is None else 60.0 * fractions[rank]] * minutes
        labels = {**job.series, "rank": str(rank), "node": f"gpu{rank:03d}"}
        sel = ",".join(f"{k}={json.dumps(v)}" for k, v in labels.items())
        out += [{"series": f"tuimon_job_wall_seconds_total{{{sel}}}",
                 "values": counter_values(wall)},
                {"series": f"tuimon_job_compute_seconds_total{{{sel}}}",
                 "values": counter_values(compute)}]
    return out


def app_firing(slo: Slo, job: Job, minutes: list[int]
               ) -> dict[int, list[tuple[str, str, str, float, float]]]:
    """The app's alerts at each minute: (severity, long, short, threshold, long burn)."""
    tracker = BurnTracker(slo)
    out: dict[int, list[tuple[str, str, str, float, float]]] = {}
    minute = 0
    for count, fractions in job.phases:
        for _ in range(count):
            minute += 1
            if fractions is not None:
                # Run time, as the app adds it: a minute, and the ranks' mean compute.
                tracker.add(minute * 60, 60.0, 60.0 * sum(fractions) / len(fractions))
            if minute in minutes:
                now = minute * 60
                rates = tracker.burn_rates(now)
                out[minute] = [(*a, rates[a[1]] or 0.0) for a in tracker.firing(now)]
    return out


def alert_tests(slo: Slo, text: str, job: Job, minutes: list[int]) -> list[dict]:
    """promtool `alert_rule_test`s asking for exactly what the app fires, with labels and
    the annotations rendered."""
    rules = {r.labels["window"]: r for r in alerts_of(text)}
    tests = []
    for minute, firing in app_firing(slo, job, minutes).items():
        expected = []
        for severity, long_w, short_w, _threshold, burn in firing:
            rule = rules[f"{long_w}/{short_w}"]
            assert rule.labels["severity"] == severity
            expected.append({
                "exp_labels": {**job.out, **rule.labels},
                "exp_annotations": {k: render(v, job.name, burn)
                                    for k, v in rule.annotations.items()},
            })
        tests.append({"eval_time": f"{minute}m", "alertname": ALERT, "exp_alerts": expected})
    return tests


def promtool_test(promtool: str, tmp_path: Path, rule_texts: list[str], tests: list[dict],
                  every: str = "1m") -> subprocess.CompletedProcess[str]:
    """`promtool test rules` on these rule files; `every`: the rule evaluation interval
    (the alerts have no `for`, so it only changes how much promtool computes)."""
    names = []
    for i, text in enumerate(rule_texts):
        (tmp_path / f"rules{i}.yml").write_text(text)
        names.append(f"rules{i}.yml")
    # JSON is YAML (flow style): the test file needs no YAML writer either.
    unit = {"rule_files": names, "evaluation_interval": every, "tests": tests}
    (tmp_path / "test.yml").write_text(json.dumps(unit, indent=1))
    return run_promtool(promtool, "test", "rules", "test.yml", cwd=tmp_path)


def windows_firing(slo: Slo, job: Job, minutes: list[int]) -> dict[int, list[str]]:
    return {m: [f"{a[1]}/{a[2]}" for a in firing]
            for m, firing in app_firing(slo, job, minutes).items()}


def llama(*phases: tuple[int, tuple[float, ...] | None]) -> Job:
    """Training job `llama` as Prometheus stores it by default: the scrape job's `job`
    wins the clash and the training job's name moves to `exported_job`."""
    labels = {"job": "tuimon", "exported_job": "llama"}
    return Job(series=labels, out=labels, name="llama", phases=list(phases))


# -- the file itself -------------------------------------------------------------------


@pytest.mark.parametrize("target", [0.9, 0.95, 0.99])
@pytest.mark.parametrize("selector", ["", 'cluster="a"', "cluster='a\"b}', partition=~\"gpu.*\","])
def test_promtool_checks_the_rules(promtool: str, tmp_path: Path, target: float,
                                   selector: str) -> None:
    (tmp_path / "tuimon.yml").write_text(rules_yaml(Slo(target, 720), selector=selector))
    done = run_promtool(promtool, "check", "rules", "tuimon.yml", cwd=tmp_path)
    assert_ok(done)
    rules = 2 * len(BURN_WINDOWS_S) + len(WAIT_WINDOWS) + len(ALERTS) + 1  # the findings'
    assert f"SUCCESS: {rules} rules found" in done.stdout


@pytest.mark.parametrize("slo", [Slo(0.9, 720), Slo(0.95, 720), Slo(0.99, 720),
                                 Slo(0.9, 168), Slo(0.999, 24 * 90)])
def test_thresholds_are_the_apps(slo: Slo) -> None:
    """Every alert compares both windows' burn rate, error ratio / (1 - target), with the
    very float tuimon.model.slo uses; the app and the rules cannot drift apart."""
    alerts = alerts_of(rules_yaml(slo))
    assert len(alerts) == len(ALERTS)
    for rule, (severity, long_w, short_w, share) in zip(alerts, ALERTS):
        assert rule.name == ALERT
        assert rule.labels == {"severity": severity, "window": f"{long_w}/{short_w}",
                               "slo_target": repr(slo.target),
                               "slo_window_hours": f"{slo.window_hours:g}"}
        long_side, op, short_side, on, seen = rule.expr
        assert op == "and" and on == "and on (exported_job, job)"
        for side, window in ((long_side, long_w), (short_side, short_w)):
            m = re.fullmatch(r"tuimon:job_error_ratio:rate(\w+) / \(1 - (\S+)\) > (\S+)", side)
            assert m, side
            assert m[1] == window
            assert float(m[2]) == slo.target
            assert float(m[3]) == slo.alert_threshold(long_w, share) * ABOVE
        # As the app, only once the data covers most of the short window.
        covered = COVERED_TO_ALERT * BURN_WINDOWS_S[short_w]
        assert seen == ("max by (exported_job, job) (tuimon_job_wall_seconds_total offset "
                        f"{covered:.0f}s)"), seen


def test_records_cover_every_burn_window() -> None:
    records = [r for r in parse_rules(rules_yaml(Slo(0.9, 720))) if r.kind == "record"]
    assert [r.name for r in records] == [
        name for w in BURN_WINDOWS_S
        for name in (f"tuimon:job_sli:rate{w}", f"tuimon:job_error_ratio:rate{w}",
                     *([wait_share_record(w)] if w in WAIT_WINDOWS else []))]
    assert records[0].expr == [
        "sum by (exported_job, job) (rate(tuimon_job_compute_seconds_total[5m]))",
        "  / (sum by (exported_job, job) (rate(tuimon_job_wall_seconds_total[5m])) > 0)"]


def test_header_names_the_slo() -> None:
    text = rules_yaml(Slo(0.95, 336), selector='cluster="a"')
    assert "# SLO target 0.95 (compute time / wall time) over 336 h; error budget 16.8 h." \
        in text
    assert '# Selector: cluster="a"; training job label: exported_job.' in text


@pytest.mark.parametrize("selector", ['cluster="a"} or vector(1) #', "cluster=a",
                                     'cluster="a"\n- alert: X', '__name__="x"',
                                     'cluster="a",,node="b"', 'cluster="a" node="b"'])
def test_a_selector_that_is_not_matchers_is_refused(selector: str) -> None:
    with pytest.raises(ValueError):
        rules_yaml(Slo(0.9, 720), selector=selector)


@pytest.mark.parametrize("label", ["", "exported job", "job}", "1job", 'job="x"'])
def test_a_job_label_that_is_not_a_label_name_is_refused(label: str) -> None:
    with pytest.raises(ValueError):
        rules_yaml(Slo(0.9, 720), job_label=label)


def test_the_module_stays_out_of_the_ui() -> None:
    code = ("import sys, tuimon.model.prom_rules\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('textual', 'aiohttp')\n"
            "       or m.startswith(('tuimon.ui', 'tuimon.sources'))]\n"
            "print(bad)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


# -- promtool test rules: alerts ------------------------------------------------------


def test_half_the_time_computing_pages_a_one_week_run(promtool: str, tmp_path: Path) -> None:
    """Target 0.9 over a 168 h run: 2% of the budget in 1 h is 3.36x; a job computing
    50% of the time burns 5x. Healthy for 2 h (0.3x: no alert, no threshold is below
    1x), then 50%: the 1h/5m page needs the 1 h error ratio up to 0.336, 39 minutes in;
    6h/30m (1.4x) comes first. The tickets wait until the job's data goes back 5.4 h,
    most of their 6 h short window (at 2.5 h a ticket would be a guess)."""
    slo = Slo(0.9, 168)
    assert slo.alert_threshold("1h", 0.02) == pytest.approx(3.36)
    assert slo.burn_rate(0.5) == pytest.approx(5.0)
    job = llama((120, HEALTHY), (300, HALF))
    minutes = [100, 150, 165, 420]
    assert windows_firing(slo, job, minutes) == {
        100: [],
        150: [],
        165: ["1h/5m", "6h/30m"],
        420: ["1h/5m", "6h/30m", "1d/6h", "3d/6h"],
    }
    text = rules_yaml(slo)
    assert_ok(promtool_test(promtool, tmp_path, [text], [{
        "interval": "1m", "input_series": input_series(job),
        "alert_rule_test": alert_tests(slo, text, job, minutes)}]))


def test_a_stalled_job_pages_a_thirty_day_slo(promtool: str, tmp_path: Path) -> None:
    """At 0.9 over 30 days the 1h/5m page is capped at 9x (10x is the most there is), so it
    takes a job computing 5% of the time (9.5x); 50% only tickets (next test). No ticket
    before 5.4 h of the job's data (most of the tickets' 6 h short window)."""
    slo = Slo(0.9, 720)
    assert slo.alert_threshold("1h", 0.02) == pytest.approx(9.0)
    job = llama((120, HEALTHY), (300, (0.05, 0.05)))
    minutes = [60, 140, 190, 330]
    assert windows_firing(slo, job, minutes) == {
        60: [], 140: [], 190: ["1h/5m"],
        330: ["1h/5m", "6h/30m", "1d/6h", "3d/6h"],
    }
    text = rules_yaml(slo)
    assert_ok(promtool_test(promtool, tmp_path, [text], [{
        "interval": "1m", "input_series": input_series(job),
        "alert_rule_test": alert_tests(slo, text, job, minutes)}]))


def test_no_alert_before_most_of_its_short_window_in_the_app_and_the_rules(
        promtool: str, tmp_path: Path) -> None:
    """A job stalled from its first minute (5% computing, 9.5x): the app and the rules
    page together once the data covers 90 % of the short window, not a minute before:
    1h/5m at 4.5 min (at 5, not at 4), 6h/30m at 27 min; the tickets at 5.4 h (324)."""
    slo = Slo(0.9, 720)
    job = llama((400, (0.05, 0.05)))
    minutes = [4, 5, 26, 27, 323, 325]
    assert windows_firing(slo, job, minutes) == {
        4: [], 5: ["1h/5m"], 26: ["1h/5m"], 27: ["1h/5m", "6h/30m"],
        323: ["1h/5m", "6h/30m"], 325: ["1h/5m", "6h/30m", "1d/6h", "3d/6h"]}
    text = rules_yaml(slo)
    assert_ok(promtool_test(promtool, tmp_path, [text], [{
        "interval": "1m", "input_series": input_series(job),
        "alert_rule_test": alert_tests(slo, text, job, minutes)}]))

def test_half_the_time_computing_tickets_but_does_not_page(promtool: str,
                                                          tmp_path: Path) -> None:
    """0.9 over 30 days, a day at 0.97 and then 50% (5x): the 3d/6h ticket (1x) once the
    3-day error ratio reaches 0.1, 4.2 h in; the 1d/6h ticket (3x) once the 1-day ratio
    reaches 0.3, 13.8 h in; never a page (6x and 9x)."""
    slo = Slo(0.9, 720)
    job = llama((1440, HEALTHY), (900, HALF))
    minutes = [1440, 1620, 1740, 2100, 2340]
    assert windows_firing(slo, job, minutes) == {
        1440: [], 1620: [], 1740: ["3d/6h"], 2100: ["3d/6h"], 2340: ["1d/6h", "3d/6h"]}
    text = rules_yaml(slo)
    assert_ok(promtool_test(promtool, tmp_path, [text], [{
        "interval": "1m", "input_series": input_series(job),
        "alert_rule_test": alert_tests(slo, text, job, minutes)}], every="5m"))


def test_a_healthy_job_fires_nothing(promtool: str, tmp_path: Path) -> None:
    """SLI 0.97 at target 0.9: burn 0.3x, below every threshold, over 3 days and more."""
    slo = Slo(0.9, 720)
    job = llama((3 * 1440 + 120, HEALTHY))
    minutes = [5, 60, 360, 1440, 3 * 1440 + 120]
    text = rules_yaml(slo)
    tests = alert_tests(slo, text, job, minutes)
    assert [t["exp_alerts"] for t in tests] == [[]] * len(minutes)
    assert_ok(promtool_test(promtool, tmp_path, [text], [{
        "interval": "1m", "input_series": input_series(job), "alert_rule_test": tests}],
        every="5m"))


def test_promtool_catches_a_wrong_expectation(promtool: str, tmp_path: Path) -> None:
    """The harness can fail: expecting a page from the healthy job is an error."""
    slo = Slo(0.9, 720)
    job = llama((120, HEALTHY))
    text = rules_yaml(slo)
    page = alerts_of(text)[0]
    wrong = [{"eval_time": "60m", "alertname": ALERT,
              "exp_alerts": [{"exp_labels": {**job.out, **page.labels}}]}]
    done = promtool_test(promtool, tmp_path, [text], [{
        "interval": "1m", "input_series": input_series(job), "alert_rule_test": wrong}])
    assert done.returncode != 0, done.stdout + done.stderr
    assert "FAILED" in done.stdout + done.stderr


def test_job_label_job_for_honor_labels(promtool: str, tmp_path: Path) -> None:
    """With `honor_labels: true` the training job keeps `job`; job_label="job"."""
    slo = Slo(0.9, 168)
    job = Job(series={"job": "llama"}, out={"job": "llama"}, name="llama",
              phases=[(120, HEALTHY), (300, HALF)])
    text = rules_yaml(slo, job_label="job")
    assert "sum by (job) (" in text and "exported_job" not in text
    tests = alert_tests(slo, text, job, [400])  # 6.7 h in: the tickets' 6 h seen
    assert len(tests[0]["exp_alerts"]) == len(ALERTS)
    assert_ok(promtool_test(promtool, tmp_path, [text], [{
        "interval": "1m", "input_series": input_series(job), "alert_rule_test": tests}]))


def test_two_clusters_two_rule_files(promtool: str, tmp_path: Path) -> None:
    """One Prometheus, one rule file per cluster (`selector`): each file sees only its own
    cluster, its records and alerts carry the cluster, and the files do not collide."""
    slo = Slo(0.9, 168)
    sick = Job(series={"job": "tuimon", "exported_job": "llama", "cluster": "a"},
               out={"job": "tuimon", "exported_job": "llama", "cluster": "a"},
               name="llama", phases=[(120, HEALTHY), (300, HALF)])
    fine = Job(series={"job": "tuimon", "exported_job": "llama", "cluster": "b"},
               out={"job": "tuimon", "exported_job": "llama", "cluster": "b"},
               name="llama", phases=[(420, (1.0, 1.0))])
    a = rules_yaml(slo, selector='cluster="a"')
    b = rules_yaml(Slo(0.9, 720), selector='cluster="b"')
    tests = alert_tests(slo, a, sick, [400])  # 6.7 h in: the tickets' 6 h seen
    assert len(tests[0]["exp_alerts"]) == len(ALERTS)
    ratio = [{"expr": "tuimon:job_error_ratio:rate1h", "eval_time": "400m",
              "exp_samples": [
                  {"labels": 'tuimon:job_error_ratio:rate1h{cluster="a",exported_job="llama",'
                             'job="tuimon"}', "value": 0.5},
                  {"labels": 'tuimon:job_error_ratio:rate1h{cluster="b",exported_job="llama",'
                             'job="tuimon"}', "value": 0}]}]
    assert_ok(promtool_test(promtool, tmp_path, [a, b], [{
        "interval": "1m", "input_series": input_series(sick) + input_series(fine),
        "alert_rule_test": tests, "promql_expr_test": ratio}]))


# -- promtool test rules: recorded values ---------------------------------------------


def test_recorded_sli_and_error_ratio(promtool: str, tmp_path: Path) -> None:
    """Values of the records: ranks at 40% and 60% make a job at 50% (the sum of seconds,
    not an average of ratios); a job whose ranks report nothing has no series, not NaN.
    Compared in millionths: rate() divides each rank's seconds by the range, so the
    exact floats depend on the order of operations."""
    half = llama((60, HEALTHY), (120, HALF))
    idle = Job(series={"job": "tuimon", "exported_job": "idle"},
               out={"job": "tuimon", "exported_job": "idle"}, name="idle",
               phases=[(30, HEALTHY), (150, None)])
    six_hours = (60 * 0.97 + 120 * 0.5) / 180  # all 3 h of the run are in the window
    checks = []

    def check(record: str, job: str, value: float | None) -> None:
        checks.append({
            "expr": f'round({record}{{exported_job="{job}"}} * 1e6)', "eval_time": "180m",
            "exp_samples": [] if value is None else [
                {"labels": f'{{exported_job="{job}",job="tuimon"}}',
                 "value": round(value * 1e6)}]})

    for window, sli in (("5m", 0.5), ("30m", 0.5), ("1h", 0.5), ("6h", six_hours)):
        check(f"tuimon:job_sli:rate{window}", "llama", sli)
        check(f"tuimon:job_error_ratio:rate{window}", "llama", 1 - sli)
    # The idle job's last step was 150 minutes ago: nothing over 5 m or 1 h...
    for window in ("5m", "1h"):
        check(f"tuimon:job_sli:rate{window}", "idle", None)
        check(f"tuimon:job_error_ratio:rate{window}", "idle", None)
    # ...but over 6 h its 30 minutes of steps are there.
    check("tuimon:job_sli:rate6h", "idle", 0.97)
    check("tuimon:job_error_ratio:rate6h", "idle", 0.03)
    text = rules_yaml(Slo(0.9, 720))
    assert_ok(promtool_test(promtool, tmp_path, [text], [{
        "interval": "1m", "input_series": input_series(half) + input_series(idle),
        "promql_expr_test": checks}]))


def test_a_wrong_recorded_value_fails(promtool: str, tmp_path: Path) -> None:
    job = llama((60, HALF))
    wrong = [{"expr": "tuimon:job_error_ratio:rate5m", "eval_time": "60m",
              "exp_samples": [{"labels": 'tuimon:job_error_ratio:rate5m{exported_job="llama",'
                                         'job="tuimon"}', "value": 0.4}]}]
    done = promtool_test(promtool, tmp_path, [rules_yaml(Slo(0.9, 720))], [{
        "interval": "1m", "input_series": input_series(job), "promql_expr_test": wrong}])
    assert done.returncode != 0, done.stdout + done.stderr


def test_recorded_wait_shares_say_what_the_step_time_waited_on(promtool: str,
                                                                tmp_path: Path) -> None:
    """Two ranks, each 60 s of steps a minute: one waits 12 s in collectives and 3 s on
    data, the other 6 s in collectives and 6 s on a checkpoint. Over the hour the job
    spent 15% of its step time in comm, 2.5% on data, 5% on checkpoints."""
    job = llama((60, (0.75, 0.8)))
    series = input_series(job)
    waits = ({"comm": 12.0, "data": 3.0}, {"comm": 6.0, "checkpoint": 6.0})
    for rank, kinds in enumerate(waits):
        sel = f'job="tuimon",exported_job="llama",rank="{rank}",node="gpu{rank:03d}"'
        for kind, per_minute in kinds.items():
            series.append({"series": f'tuimon_job_wait_seconds_total{{{sel},kind="{kind}"}}',
                           "values": counter_values([per_minute] * 60)})
    checks = [{
        "expr": f'round({wait_share_record("1h")}{{exported_job="llama",kind="{kind}"}} * 1e6)',
        "eval_time": "60m",
        "exp_samples": [{"labels": f'{{exported_job="llama",job="tuimon",kind="{kind}"}}',
                         "value": round(share * 1e6)}]}
        for kind, share in (("comm", 0.15), ("data", 0.025), ("checkpoint", 0.05))]
    assert_ok(promtool_test(promtool, tmp_path, [rules_yaml(Slo(0.9, 720))], [{
        "interval": "1m", "input_series": series, "promql_expr_test": checks}]))


def test_a_leafs_congestion_pages_with_the_leaf_named(promtool: str, tmp_path: Path) -> None:
    """A relay's `tuimon_finding` for a leaf's congestion (its labels as the relay writes
    them: tuimon_core.serving.finding_metrics) and its text: the finding alert fires after
    its `for`, labelled with the leaf, the text in its description; information fires
    nothing; a finding gone resolves."""
    from tuimon.model.prom_rules import FINDING_ALERT
    from tuimon_core.serving.finding_metrics import FINDING_LABELS

    labels = dict.fromkeys(FINDING_LABELS, "")
    leaf = {**labels, "kind": "congestion", "severity": "warning", "component": "leaf01",
            "leaf": "leaf01", "job": ""}
    info = {**labels, "kind": "no_topology", "severity": "info", "component": "topology"}
    text = "congestion concentrated under leaf01: xmit_wait 3,981,200/s vs 1,150/s"

    def series(name: str, values: dict[str, str]) -> str:
        inner = ",".join(f'{k}="{v}"' for k, v in values.items() if v)
        return f"{name}{{instance=\"relay:9478\",job=\"relay\",{inner}}}"
    expected = {"alertname": FINDING_ALERT, "instance": "relay:9478", "job": "relay",
                **{k: v for k, v in leaf.items() if v}}
    tests = [{
        "interval": "15s",
        "input_series": [
            {"series": series("tuimon_finding", leaf), "values": "1x8 _x8"},
            {"series": series("tuimon_finding_info", {"kind": "congestion",
                                                       "component": "leaf01",
                                                       "text": text}),
             "values": "1x8 _x8"},
            {"series": series("tuimon_finding", info), "values": "1x16"},
        ],
        "alert_rule_test": [
            {"eval_time": "15s", "alertname": FINDING_ALERT, "exp_alerts": []},
            {"eval_time": "60s", "alertname": FINDING_ALERT, "exp_alerts": [{
                "exp_labels": expected,
                "exp_annotations": {"summary": "congestion leaf01 (warning)",
                                    "description": text}}]},
            {"eval_time": "8m", "alertname": FINDING_ALERT, "exp_alerts": []},
        ],
    }]
    assert_ok(promtool_test(promtool, tmp_path, [rules_yaml(Slo(0.9, 720))], tests,
                            every="15s"))
