"""The terminal app, driven headless with Pilot, on a seeded simulated cluster."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import pytest

from agent.sim.cluster import SimCluster
from tests.seeded import judged, seeded_cluster, watched_by_app
from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis
from tuimon.model.judge_config import JudgeConfig
from tuimon.model.judgement import JUDGE_MAX_TICKS, Judgement
from tuimon.model.map_kinds import GLYPHS
from tuimon.model.node_state import ClusterEvent
from tuimon.model.storage import StorageView
from tuimon.sources.agent_stream import StreamOptions
from tuimon.ui.app import TuimonApp
from tuimon.ui.heatmap import HeatmapView
from tuimon.ui.help_screen import HelpScreen
from tuimon.ui.node_screen import NodeScreen
from tuimon.ui.panels import EventsPane
from tuimon_core.wording import held_text


async def make_app(nodes: int = 16) -> TuimonApp:
    cluster, sim = await seeded_cluster(nodes)
    topology = {m.name: sim.leaf_of(m.index) for m in sim.members}
    provisioned = {"/lustre/scratch": sim.lustre_provisioned}
    storage = StorageView(provisioned)
    storage.update(cluster)
    diagnosis, _ = judged(cluster, topology, storage)  # as if watched for a few seconds
    judgement = judging(cluster, diagnosis, JudgeConfig(topology=topology,
                                                        provisioned=provisioned))
    return TuimonApp(cluster, judgement=judgement, refresh=3600, clock_text=lambda: "12:00:00")


def judging(cluster: ClusterState, diagnosis: Diagnosis,
            config: JudgeConfig | None = None) -> Judgement:
    """The app's judgement, its diagnosis one that has already watched the cluster."""
    return replace((config or JudgeConfig()).judgement(cluster), diagnosis=diagnosis)


def line_text(view: HeatmapView, y: int) -> str:
    return view.render_line(y).text


async def test_cursor_moves_with_arrows_and_hjkl_and_enter_opens_the_node() -> None:
    app = await make_app(16)
    async with app.run_test(size=(120, 40)) as pilot:
        heat = app.active_map
        assert heat.current.name == "sim-node000"
        await pilot.press("right")
        assert heat.current.name == "sim-node001"
        await pilot.press("l", "l")
        assert heat.current.name == "sim-node003"
        await pilot.press("h")
        assert heat.current.name == "sim-node002"
        per_row = len(heat._hm_lines[0].nodes)
        await pilot.press("down")
        assert heat.current.name == f"sim-node{2 + per_row:03d}"
        await pilot.press("k")
        assert heat.current.name == "sim-node002"
        await pilot.press("enter")
        assert isinstance(app.screen, NodeScreen)
        assert app.screen.node.name == "sim-node002"
        title = str(app.screen.query_one("#node-title").render())
        assert "sim-node002" in title and "up" in title
        gpus = str(app.screen.query_one("#node-gpus").render())
        assert "NVIDIA H" in gpus and "procs" in gpus
        fabric = str(app.screen.query_one("#node-fabric").render())
        assert "mlx5_0:1" in fabric and "ACTIVE" in fabric
        await pilot.press("escape")
        assert not isinstance(app.screen, NodeScreen)


async def test_mouse_click_selects_and_double_click_opens() -> None:
    app = await make_app(16)
    async with app.run_test(size=(120, 40)) as pilot:
        heat = app.active_map
        tile = heat._tile_width()
        await pilot.click(HeatmapView, offset=(tile + 2, 0))
        assert heat.current.name == "sim-node001"
        await pilot.click(HeatmapView, offset=(2 * tile + 2, 0), times=2)
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.node.name == "sim-node002"


async def test_filter_by_regex_and_clear() -> None:
    app = await make_app(16)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("slash")
        await pilot.press(*"node00[1-3]")
        await pilot.press("enter")
        heat = app.active_map
        assert [n.name for n in heat._hm_order] == ["sim-node001", "sim-node002", "sim-node003"]
        assert "filter /node00[1-3]/" in str(app.query_one("#legend").render())
        await pilot.press("escape")
        assert len(heat._hm_order) == 16
        # The host-list syntax used everywhere else, and a leaf switch's name.
        await pilot.press("slash", *"sim-node[008-010,015]", "enter")
        assert [n.name for n in heat._hm_order] == [
            "sim-node008", "sim-node009", "sim-node010", "sim-node015"]
        leaf = app.view.topology["sim-node003"]
        await pilot.press("escape", "slash", *leaf, "enter")
        assert {n.name for n in heat._hm_order} == {
            n for n, lf in app.view.topology.items() if lf == leaf}


async def test_bad_filter_is_refused_with_the_reason() -> None:
    app = await make_app(4)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("slash", *"gpu[", "enter")
        error = str(app.screen.query_one("#filter-error").render())
        assert "bad filter" in error
        await pilot.press("escape")
        assert len(app.active_map._hm_order) == 4


async def test_sort_by_metric_puts_the_worst_first() -> None:
    app = await make_app(16)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")  # temperature
        await pilot.press("s")
        heat = app.active_map
        hottest = max(app.cluster.nodes.values(),
                      key=lambda n: max(g["temp"] for g in n.gpu_values()))
        assert heat._hm_order[0] is hottest
        assert "sorted by temp" in str(app.query_one("#legend").render())
        await pilot.press("s")
        assert heat._hm_order[0].name == "sim-node000"


async def test_metric_keys_switch_the_map_and_the_legend() -> None:
    app = await make_app(8)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("6")
        assert app.active_map.metric.key == "health"
        assert "health" in str(app.query_one("#legend").render())
        await pilot.press("tab")
        assert app.active_map.kind == "fabric"
        await pilot.press("2")
        assert app.active_map.metric.key == "congestion"
        # The fabric map has three metrics: keys past them do nothing, and the footer
        # offers the map's own range.
        await pilot.press("6")
        assert app.active_map.metric.key == "congestion"
        assert any(b.key_display == "1-3" for b in app.active_map._bindings.key_to_bindings["1"])
        # Grouped by leaf switch: the first line is a leaf label.
        assert line_text(app.active_map, 0).strip().startswith("leaf00")


async def test_theme_cycles_and_heatmap_colours_follow() -> None:
    app = await make_app(4)
    async with app.run_test(size=(120, 40)) as pilot:
        heat = app.active_map
        before_theme = app.theme
        before = heat.render_line(0)
        await pilot.press("t")
        await pilot.pause()
        assert app.theme != before_theme and app.theme in app.theme_names
        after = heat.render_line(0)
        assert after.text == before.text
        assert [s.style for s in after] != [s.style for s in before]


async def test_a_textual_builtin_theme_still_draws_the_heat_scale() -> None:
    """A theme without tuimon's heat variables (one of Textual's own, from the command
    palette) falls back to the packaged scale instead of failing the CSS."""
    app = await make_app(4)
    async with app.run_test(size=(120, 40)) as pilot:
        heat = app.active_map
        app.theme = "nord"
        await pilot.pause()
        assert app.theme == "nord"
        cells = [s for s in heat.render_line(0) if s.text.strip() and s.text[0] in GLYPHS]
        assert cells and all(s.style is not None and s.style.color is not None for s in cells)


async def test_the_map_is_styled_by_component_classes_that_css_can_override() -> None:
    class Restyled(TuimonApp):
        CSS = "HeatmapView > .heatmap--cursor { background: #123456; }"

    cluster, _ = await seeded_cluster(4)
    app = Restyled(cluster, refresh=3600)
    async with app.run_test(size=(120, 40)):
        name = next(s for s in app.active_map.render_line(0) if "sim-node000" in s.text)
        assert name.style is not None and name.style.bgcolor is not None
        assert name.style.bgcolor.triplet is not None
        assert name.style.bgcolor.triplet.hex == "#123456"


async def test_moving_the_cursor_redraws_only_the_lines_it_left_and_entered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    app = await make_app(16)
    async with app.run_test(size=(120, 40)) as pilot:
        heat = app.active_map
        await pilot.pause()
        assert len(heat._hm_lines) >= 3
        redrawn: list[int] = []
        real = heat.refresh_line

        def spy(y: int) -> None:
            redrawn.append(y)
            real(y)
        monkeypatch.setattr(heat, "refresh_line", spy)
        await pilot.press("down")
        assert sorted(redrawn) == [0, 1]
        redrawn.clear()
        for _ in range(100):  # the screen draws them at its next update
            if all(heat._key(li) in heat._hm_strips for li in (0, 1)):
                break
            await pilot.pause(0.02)
        redrawn.clear()
        await pilot.press("right")  # along the same line
        assert redrawn == [1]


async def test_a_draw_with_nothing_new_reads_no_node_and_a_change_is_drawn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Between a source's reads (Prometheus every 5 s), the draws each second find
    nothing new without reading every visible node again; a node that changes is
    redrawn at the next."""
    app = await make_app(16)
    async with app.run_test(size=(120, 40)) as pilot:
        heat = app.active_map
        await pilot.pause()
        heat.refresh_changed()
        read: list[int] = []
        redrawn: list[int] = []
        key, line = heat._key, heat.refresh_line
        monkeypatch.setattr(heat, "_key", lambda li: read.append(li) or key(li))
        monkeypatch.setattr(heat, "refresh_line", lambda y: redrawn.append(y) or line(y))
        heat.refresh_changed()
        assert read == [] and redrawn == []
        target = heat._hm_lines[1].nodes[0].target
        app.cluster.mark_stale(target, "no series for this node in Prometheus")
        heat.refresh_changed()
        assert read and redrawn == [1]


async def test_a_new_clock_in_the_header_is_shown_without_laying_the_screen_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each second the header's clock changes and the storage pane's rates: both show
    it, and nothing else moves (a one-line header, as many mounts), so the screen is not
    laid out again for it; a mount more or less still is."""
    from textual.screen import Screen

    from tuimon.ui.panels import HeaderBar, StoragePanel

    app = await make_app(16)
    now = ["12:00:00"]
    app.clock_text = lambda: now[0]
    async with app.run_test(size=(120, 40)) as pilot:
        app.tick()
        await pilot.pause()
        laid_out: list[int] = []
        layout = Screen._refresh_layout
        monkeypatch.setattr(Screen, "_refresh_layout",
                            lambda self, *a, **k: laid_out.append(1) or layout(self, *a, **k))
        now[0] = "12:00:01"
        app.tick()
        await pilot.pause()
        header = app.query_one(HeaderBar)
        assert "12:00:01" in str(header.render()) and "12:00:01" in str(header._shown_text)
        assert laid_out == []
        storage = app.query_one(StoragePanel)
        shown = str(storage._shown_text)
        storage.update(shown.replace("/lustre/scratch", "/lustre/scratcH"))
        await pilot.pause()
        assert "scratcH" in str(storage.render()) and laid_out == []
        storage.update(shown + "\n /nfs/home")
        await pilot.pause()
        assert laid_out and "/nfs/home" in str(storage.render())


async def test_the_strip_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import tuimon.ui.heatmap as heatmap

    monkeypatch.setattr(heatmap, "STRIP_CACHE_LINES", 3)
    app = await make_app(16)
    async with app.run_test(size=(120, 40)):
        heat = app.active_map
        for y in range(len(heat._hm_lines)):
            heat.render_line(y)
        assert len(heat._hm_lines) > 3 and len(heat._hm_strips) <= 3
        assert heat.render_line(0).text == heat.render_line(0).text  # drawn again on demand


async def test_help_screen_opens_and_closes() -> None:
    app = await make_app(4)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_large_cluster_folds_to_one_cell_per_node() -> None:
    cluster, _ = await seeded_cluster(nodes=300, gpus=2, samples=1)
    for i in range(40):  # agents not connected yet: no hello, no cells
        cluster.add_target(f"10.0.0.{i}:9477")
    app = TuimonApp(cluster, refresh=3600)
    async with app.run_test(size=(80, 24)) as pilot:
        heat = app.active_map
        assert heat.folded
        assert len(heat._hm_lines[0].nodes) == 40  # 2 columns a node
        assert "folded" in str(app.query_one("#header").render())
        assert "\u00b7\u00b7" in line_text(heat, 0)  # the unconnected ones: no data
        await pilot.press("down")
        assert heat.current.name == "sim-node000"  # row 2, after the 40 unconnected


async def test_a_stopped_node_goes_stale_and_comes_back_in_the_app(
        unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=3, gpus=2, base_port=unused_tcp_port_factory(), interval=0.2)
    cluster = ClusterState("live")
    sources = watched_by_app(sim.targets, StreamOptions(min_backoff=0.1, max_backoff=0.3))

    async with sim:
        app = TuimonApp(cluster, sources=sources, refresh=0.2)
        async with app.run_test(size=(120, 30)) as pilot:
            async def until(predicate) -> None:  # type: ignore[no-untyped-def]
                for _ in range(100):
                    if predicate():
                        return
                    await pilot.pause(0.1)
                raise AssertionError("timed out")

            await until(lambda: cluster.counts()["up"] == 3)
            await sim.stop_node(1)
            victim = cluster.nodes[sim.targets[1]]
            await until(lambda: victim.status == "stale")
            await until(lambda: "1 stale" in str(app.query_one("#header").render()))
            row = line_text(app.active_map, 0)
            assert "\u2591" in row  # the stale node's cells
            assert "node_lost" in [e.kind for e in cluster.events]
            await sim.start_node(1)
            await until(lambda: victim.status == "up")
            await until(lambda: "0 stale" in str(app.query_one("#header").render()))


@pytest.mark.parametrize("size", [(200, 50), (80, 24), (120, 40), (250, 60)])
def test_snapshot_main_screen(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    app = asyncio.run(make_app(32))
    assert snap_compare(app, terminal_size=size)


def test_snapshot_fabric_map(snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = asyncio.run(make_app(32))
    assert snap_compare(app, terminal_size=(160, 40), press=["tab", "2"])


@pytest.mark.parametrize("size", [(160, 50), (80, 24)])
def test_snapshot_node_screen(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    app = asyncio.run(make_app(8))
    assert snap_compare(app, terminal_size=size, press=["right", "enter"])


def test_control_characters_in_names_are_escaped() -> None:
    from tuimon.text.markup import safe

    shown = safe("evil\x1b[2Jnode\x07")
    assert "\x1b" not in shown and "\x07" not in shown
    assert shown.startswith("evil\\x1b") and shown.endswith("\\x07")
    assert safe("[b]bold[/b]") == "\\[b]bold\\[/b]"  # no markup injection either


async def test_nodes_named_by_the_diagnosis_are_highlighted_on_the_map() -> None:
    app = await make_app(16)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        heat = app.active_map
        assert heat.faults, "the seeded cluster's congested leaf and hot GPU are named"
        leaf_nodes = {n for n, leaf in app.view.topology.items()
                      if any(f.kind == "congestion" and f.where == leaf
                             for f in app.diagnosis.findings)}
        assert leaf_nodes and leaf_nodes <= set(heat.faults)
        name = next(n for n in sorted(heat.faults) if n != heat.current.name)
        line = next(i for i, ln in enumerate(heat._hm_lines)
                    if any(n.name == name for n in ln.nodes))
        strip = heat.render_line(line)
        styled = [s for s in strip if s.text.strip() == name]
        assert styled and styled[0].style.underline


async def test_job_selector_cycles_the_efficiency_strip() -> None:
    app = await make_app(4)
    async with app.run_test(size=(200, 40)) as pilot:
        now = app.efficiency.now
        for name in ("alpha", "beta"):
            job = app.efficiency._job(name)
            job.world = 8
            job.history.extend((now - 10 + i, 8.0, 7.0, 80) for i in range(10))
        app.tick()
        strip = str(app.query_one("#slo").render())
        assert "alpha" in strip and "[1/2, J: next]" in strip
        await pilot.press("J")
        strip = str(app.query_one("#slo").render())
        assert "beta" in strip and "[2/2, J: next]" in strip


def rendered_lines(widget) -> list[str]:  # type: ignore[no-untyped-def]
    """What a widget shows, line by line, as the terminal gets it."""
    from textual.geometry import Region

    size = widget.size
    return [strip.text for strip in widget.render_lines(Region(0, 0, size.width, size.height))]


@pytest.mark.parametrize("width,height", [(80, 24), (100, 30), (120, 40), (160, 45),
                                          (200, 50), (250, 60)])
async def test_every_width_lays_out_without_wrapping(width: int, height: int) -> None:
    app = await make_app(32)
    async with app.run_test(size=(width, height)) as pilot:
        now = app.efficiency.now
        job = app.efficiency._job("llm-pretrain-70b-long-name")
        job.world = 256
        job.history.extend((now - 60 + i, 8.0, 5.6, 256) for i in range(60))
        app.tick()
        await pilot.pause()
        # One line each: a wrapped header or strip would push the map down a line.
        for widget_id in ("#header", "#slo", "#legend"):
            widget = app.query_one(widget_id)
            assert widget.size.height == 1, (widget_id, widget.size)
            assert widget.size.width == width
        # Every panel line fits its width, cut with an ellipsis where it must be.
        for widget_id in ("#header", "#slo", "#legend", "#storage", "#events"):
            for line in rendered_lines(app.query_one(widget_id)):
                assert len(line.rstrip()) <= width
        header = rendered_lines(app.query_one("#header"))[0]
        assert "32 up" in header and ":00:00" in header  # counts and clock survive at 80
        slo = rendered_lines(app.query_one("#slo"))[0]
        assert "burn" in slo
        diag = app.query_one("#diagnosis")
        assert diag.size.height >= 3  # the diagnosis always has room
        # The map is as tall as its rows, never taller: no blank rows above the findings.
        heat = app.active_map
        assert heat.size.height <= max(2, len(heat._hm_lines))


async def test_node_screen_keys_do_not_move_the_map_below() -> None:
    app = await make_app(16)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("right", "enter")
        assert isinstance(app.screen, NodeScreen)
        heat = app.map_views()[0] if hasattr(app, "map_views") else app.query_one("#gpu-map")
        before = (heat.current.name, heat.metric.key, app.view.sort, app.view.reverse,
                  app.view.filter_text)
        await pilot.press("right", "down", "l", "j", "3", "s", "S", "tab", "J")
        assert isinstance(app.screen, NodeScreen) and app.screen.node.name == "sim-node001"
        after = (heat.current.name, heat.metric.key, app.view.sort, app.view.reverse,
                 app.view.filter_text)
        assert after == before
        assert heat.display and not app.query_one("#fabric-map").display
        await pilot.press("escape")
        assert app.active_map.current.name == "sim-node001"


async def test_node_screen_lists_each_gpus_processes_with_their_job() -> None:
    app = await make_app(4)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.press("enter")
        gpus = str(app.screen.query_one("#node-gpus").render())
        assert "MHz" in gpus  # wide: clocks, P-state, ECC, XIDs
        rows = [ln for ln in gpus.splitlines() if "slurm job" in ln]
        assert len(rows) == 8  # one process per GPU in the simulated job
        assert all("ana" in r and "pretrain.py" in r and "slurm job 812345" in r
                   for r in rows)
        assert "--local-rank=3" in rows[3]


async def test_node_screen_of_a_node_that_reports_less_says_so_plainly() -> None:
    """A node seen through a source that reports no PCIe link and no file system (a
    Prometheus fleet whose exporters lack them): its screen shows `-` for the link, says
    no file system was reported, keeps the source's whole version string, and names the
    node once in its title when it is read where it is named."""
    app = await make_app(4)
    node = app.cluster.nodes[sorted(app.cluster.nodes)[0]]
    for g in node.detail.gpus:
        g.pop("pcie_gen", None)
        g.pop("pcie_width", None)
    for info in node.hello.gpus:
        info.pcie_gen_max = info.pcie_width_max = None
    node.detail.extra.pop("storage", None)
    node.hello.agent_version = "prometheus via tuimon 0.0.0-long-version"
    async with app.run_test(size=(200, 50)) as pilot:
        app.active_map.select(node)
        await pilot.press("enter")
        await pilot.pause()
        title = str(app.screen.query_one("#node-title").render())
        assert node.name in title and node.target in title  # reached elsewhere: both
        node.target = node.name  # a Prometheus node: read where it is named
        app.screen.refresh_view()
        assert str(app.screen.query_one("#node-title").render()).count(node.name) == 1
        gpus = str(app.screen.query_one("#node-gpus").render())
        rows = [line for line in gpus.splitlines() if "MHz" in line]  # a GPU's, not a pid's
        assert len(rows) == len(node.detail.gpus) == 8, gpus  # drawn, link column and all
        assert "Gen" not in gpus and "x?" not in gpus
        app.screen.node = app.cluster.nodes[sorted(app.cluster.nodes)[1]]  # a full one
        app.screen.refresh_view()
        assert "Gen" in str(app.screen.query_one("#node-gpus").render())
        app.screen.node = node
        app.screen.refresh_view()
        storage = str(app.screen.query_one("#node-storage").render())
        assert storage.split() == ["file", "systems", "none", "reported"], storage
        agent = str(app.screen.query_one("#node-agent").render())
        assert "prometheus via tuimon 0.0.0-long-version" in agent


async def test_a_down_node_says_why_first() -> None:
    app = await make_app(4)
    victim = next(n for n in app.cluster.nodes.values() if n.name == "sim-node002")
    app.cluster.mark_stale(victim.target, "connection refused by 127.0.0.1:9477")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("right", "right", "enter")
        assert app.screen.node is victim
        why = app.screen.query_one("#node-why")
        assert why.display
        text = str(why.render())
        assert "connection refused by 127.0.0.1:9477" in text
        assert "last values" in text or "last ones received" in text


async def test_tab_keeps_the_selected_node_on_the_other_map() -> None:
    app = await make_app(16)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("right", "right", "right", "down")
        chosen = app.active_map.current
        await pilot.press("tab")
        assert app.active_map.kind == "fabric"
        assert app.active_map.current is chosen
        await pilot.press("tab")
        assert app.active_map.current is chosen


async def test_sort_reverses_with_shift_s() -> None:
    app = await make_app(16)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3", "s")
        heat = app.active_map
        hottest = heat._hm_order[0]
        await pilot.press("S")
        assert heat._hm_order[-1] is hottest and heat._hm_order[0] is not hottest
        assert "sorted by temp, best first" in str(app.query_one("#legend").render())
        await pilot.press("s")  # back to names, still reversed
        assert heat._hm_order[0].name == "sim-node015"
        assert "sorted by name, Z to A" in str(app.query_one("#legend").render())


async def test_the_filter_is_never_cut_off_says_no_match_and_finds_jobs_and_users() -> None:
    """At 200 columns the legend keeps the filter (it comes right after the title); a
    filter that matches nothing says so on the map; a Slurm job id, a pod or a user (from
    the node's overview: who runs there) finds the nodes it runs on."""
    app = await make_app(16)
    target = sorted(app.cluster.nodes)[5]
    node = app.cluster.nodes[target]
    node.overview = {**node.overview, "who": ["999001", "ml/trainer-0", "alice"]}
    async with app.run_test(size=(200, 50)) as pilot:
        for text, expect in (("999001", [node.name]), ("trainer-0", [node.name]),
                             ("nobody-here", [])):
            await pilot.press("slash", *text, "enter")
            await pilot.pause()
            legend = str(app.query_one("#legend").render())
            assert f"filter /{text}/" in legend, legend
            assert [n.name for n in app.active_map._hm_order] == expect
            if not expect:
                assert "no node matches" in legend
                assert "no node matches the filter /nobody-here/" in line_text(
                    app.active_map, 0)
            await pilot.press("escape")


async def test_at_80x24_the_map_uses_the_room_the_other_panes_leave() -> None:
    """32 nodes at 80x24: every GPU still drawn (the names without the `sim-node` they
    all share: `sim-node`), not folded to one line over empty rows; and the findings below it stay
    on the screen, which never scrolls."""
    app = await make_app(32)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        heat = app.active_map
        assert not heat.folded
        assert line_text(heat, 0).startswith("000 "), line_text(heat, 0)
        assert heat.size.height >= 6
        pane = app.query_one("#diagnosis")
        assert pane.groups and pane.region.bottom <= 24 - 1 - EventsPane.MIN_ROWS
        assert app.screen.virtual_size.height <= 24
        await pilot.press("right")
        assert "sim-node001" in str(app.query_one("#legend").render())


async def test_help_fits_80x24_names_J_and_scrolls() -> None:
    app = await make_app(4)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        box = app.screen.query_one("VerticalScroll")
        assert box.size.width <= 80 and box.outer_size.height <= 24
        static = app.screen.query_one("Static")
        text = str(static.render())
        assert "J " in text and "next job" in text and "reverse" in text
        # No line wraps in the box (a wrapped key line reads as a key of its own).
        room = static.content_size.width
        assert all(len(line) <= room for line in text.splitlines()), (room, [
            line for line in text.splitlines() if len(line) > room])
        await pilot.press("escape")
        await pilot.press("J")  # one job or none: a visible answer, not silence
        await pilot.pause()
        assert any("job" in str(n.message) for n in app._notifications)


async def test_replay_keys_are_in_the_help() -> None:
    from tuimon.sources.recording import ReplayControl
    from tuimon.ui.replay_app import ReplayApp

    cluster, _ = await seeded_cluster(4)
    app = ReplayApp(cluster, ReplayControl(), 60.0, refresh=3600)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("question_mark")
        text = str(app.screen.query_one("Static").render())
        assert "Replay" in text and "pause" in text and "faster" in text
        # The palette offers the player's keys and the map's alike.
        titles = {c.title for c in app.get_system_commands(app.screen_stack[0])}
        assert {"filter", "fleet", "findings"} <= titles, titles
        assert len(titles & {b.description for b in ReplayApp.BINDINGS}) >= 3, titles


async def seventeen_lost() -> TuimonApp:
    """20 nodes, 17 of them lost (one finding for them, the worst), judged."""
    cluster, sim = await seeded_cluster(20, gpus=2)
    for m in sim.members[1:18]:
        cluster.mark_stale(m.target, "connection refused")
    diagnosis, _ = judged(cluster)
    return TuimonApp(cluster, refresh=3600, judgement=judging(cluster, diagnosis))


async def test_findings_grouped_and_opened_from_the_diagnosis_pane() -> None:
    app = await seventeen_lost()
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        pane = app.query_one("#diagnosis")
        lost = [g for g in pane.groups if g.kind == "node_lost"]
        assert len(lost) == 1, [g.text for g in pane.groups]
        assert lost[0].text.startswith("17 nodes lost: sim-node[001-017]")
        await pilot.press("f")
        assert pane.has_focus
        # Open the first line: 17 nodes, so the map is filtered to them.
        pane.highlighted = 1 + pane.groups.index(lost[0])
        await pilot.press("enter")
        await pilot.pause()
        assert len(app.active_map._hm_order) == 17
        assert "filter /sim-node[001-017]/" in str(app.query_one("#legend").render())


async def test_the_picked_findings_host_list_is_copied_and_its_drain_command_shown(
        ) -> None:
    """`c` copies the picked finding's nodes as one host list (OSC 52, and shown for a
    terminal that refuses it); `d` shows and copies Slurm's drain command for them,
    quoted for the shell, never run; a hostile node name is left out of both."""
    cluster, sim = await seeded_cluster(20, gpus=2)
    for m in sim.members[1:18]:
        cluster.mark_stale(m.target, "connection refused")
    evil = sim.members[19].target
    cluster.apply_hello(evil, replace(cluster.nodes[evil].hello, node="x;reboot"))
    cluster.mark_stale(evil, "connection refused")
    diagnosis, _ = judged(cluster)
    app = TuimonApp(cluster, refresh=3600, judgement=judging(cluster, diagnosis))
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        pane = app.query_one("#diagnosis")
        lost = next(g for g in pane.groups if g.kind == "node_lost")
        assert "x;reboot" in lost.nodes
        await pilot.press("f")
        pane.highlighted = 1 + pane.groups.index(lost)
        await pilot.press("c")
        assert app.clipboard == "sim-node[001-017]"
        shown = [n.message for n in app._notifications]
        assert any("copied: sim-node[001-017]" in m and "1 name(s) left out" in m
                   for m in shown), shown
        await pilot.press("d")
        assert app.clipboard == ("scontrol update NodeName='sim-node[001-017]' State=DRAIN "
                                 "Reason='tuimon: node lost'"), app.clipboard
        assert "reboot" not in app.clipboard and ";" not in app.clipboard
        assert any("tuimon does not run it" in n.message for n in app._notifications)


async def test_f_then_enter_opens_the_worst_finding() -> None:
    """What the pane's header says (`f: select, enter: open`) works as typed: `f` picks
    the worst finding when none is picked, and enter opens it."""
    app = await seventeen_lost()
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        pane = app.query_one("#diagnosis")
        worst = pane.groups[0]
        assert worst.kind == "node_lost" and len(worst.nodes) == 17, worst
        await pilot.press("f")
        await pilot.pause()
        assert pane.has_focus and pane.highlighted == 1
        await pilot.press("enter")
        await pilot.pause()
        assert len(app.active_map._hm_order) == 17
        # Back at the map and in again: the pick stays where the user left it.
        await pilot.press("escape", "f", "down")
        await pilot.pause()
        assert pane.highlighted == min(2, len(pane.groups))


async def test_the_diagnosis_says_how_long_each_finding_has_held_as_status_does() -> None:
    """Each finding's line ends as `tuimon status` says it (`; since 00:53 (9 s)`), on
    the judgement's clock; as time passes the lines age in place, the pick kept."""
    from tuimon.status import format_text, report
    from tuimon_core.wording import onset_text

    app = await make_app(16)
    clock = app.diagnosis.wall
    async with app.run_test(size=(200, 45)) as pilot:
        await pilot.pause()
        pane = app.query_one("#diagnosis")
        shown = [str(pane.get_option_at_index(i + 1).prompt) for i in range(len(pane.groups))]
        assert len(shown) >= 2, shown
        for g, line in zip(pane.groups, shown):
            assert g.since is not None
            assert line.endswith(f"{g.text}; since {onset_text(g.since, clock())}"), line
        # status's line: the same words, and the same onset (its own clock is now's).
        said = re.sub(r"(Mon |Tue |Wed |Thu |Fri |Sat |Sun )?(\d\d:\d\d) \([^)]*\)", r"\2",
                      format_text(report(app.cluster, app.efficiency, app.diagnosis.findings,
                                         "ok")))
        assert all(re.sub(r" \([^)]*\)$", "", line) in said for line in shown), (shown, said)
        await pilot.press("f", "down")
        clock.now += 60.0  # type: ignore[attr-defined]
        pane.update_from(app.diagnosis.findings, 200, clock())
        await pilot.pause()
        assert pane.highlighted == 2
        g = pane.groups[0]
        assert str(pane.get_option_at_index(1).prompt).endswith(
            f"; since {onset_text(g.since, clock())}")


async def test_a_finding_on_one_node_opens_that_node() -> None:
    app = await make_app(16)
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        pane = app.query_one("#diagnosis")
        index = next(i for i, g in enumerate(pane.groups) if len(g.nodes) == 1)
        node_name = pane.groups[index].nodes[0]
        (finding,) = pane.groups[index].findings
        assert finding.first_seen is not None
        await pilot.press("f")
        pane.highlighted = index + 1
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.node.name == node_name
        # Its findings there say since when they hold, as the diagnosis does.
        shown = str(app.screen.query_one("#node-findings").render())
        assert held_text(finding.message, finding.first_seen, app.diagnosis.wall()) in shown, \
            shown
        await pilot.press("escape")
        assert app.active_map.current.name == node_name


async def test_a_cluster_too_large_to_judge_every_tick_is_judged_less_often_and_says_so(
) -> None:
    # The judgement reads every node: where it would take more than a tenth of the time,
    # it runs less often than the map is drawn, and the header says how often. A short
    # refresh stands in for thousands of nodes at one a second.
    from dataclasses import replace

    seeded, _ = await seeded_cluster(nodes=4, gpus=8, samples=1)
    cluster = ClusterState("large")
    for i in range(2000):
        node = list(seeded.nodes.values())[i % 4]
        target = f"10.1.{i // 250}.{i % 250}:9477"
        cluster.apply_hello(target, replace(node.hello, node=f"gpu{i:04d}"))
        cluster.apply_sample(target, node.sample)
    ticks = 0

    class CountingApp(TuimonApp):
        def tick(self) -> None:
            nonlocal ticks
            ticks += 1
            super().tick()

    app = CountingApp(cluster, refresh=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(1.5)
        (fs, *_) = app.storage.filesystems.values()
        judgements = len(fs.read_hist)
        assert app.pace.every > app.refresh_every
        # whole ticks, and never past the cap (one stall must not stop it for minutes)
        per = app.pace.every / app.refresh_every
        assert abs(per - round(per)) < 1e-6 and per <= JUDGE_MAX_TICKS
        assert 1 <= judgements < ticks / 2, (judgements, ticks)
        assert "judged every" in str(app.query_one("#header").render())
        assert fs.nodes == 2000  # what it judges is the whole cluster


async def test_quitting_while_the_timers_fire_ends_cleanly() -> None:
    # The draw and tick timers outlive the screen's widgets by a moment at exit: a user who
    # quits must not get a traceback from a timer that fires then (it did on a slow CI
    # machine; with a 1 ms refresh it did in three exits of four). Some exits leave the
    # node screen open, whose own timer refreshes it.
    for i in range(6):
        app = await make_app(4)
        app.refresh_every = 0.001
        async with app.run_test(size=(80, 24)) as pilot:
            if i % 2:
                await pilot.press("enter")
            await pilot.pause(0.05)
        assert app.return_code in (None, 0)


async def test_the_node_screen_shows_a_ports_errors_over_their_window() -> None:
    """Error counters are read one sample in five: the latest sample's increments are
    mostly empty, but the port's row says what the diagnosis holds over ten minutes."""
    app = await make_app(8)
    node = next(iter(app.cluster.nodes.values()))
    port = node.port_ids[1]
    node.conditions = [*(node.conditions or []), {
        "severity": "warning", "kind": "symbol_errors", "port": port,
        "message": f"{node.name} {port} +873 symbol errors in 10 min (cable or transceiver)"}]
    async with app.run_test(size=(200, 50)) as pilot:
        app.active_map.select(node)
        await pilot.press("enter")
        await pilot.pause()
        fabric = str(app.screen.query_one("#node-fabric").render())
        row = next(line for line in fabric.splitlines() if port in line)
        assert "+873 symbol errors in 10 min" in row, row
        assert f"{node.name} {port} +873" not in row  # said once, on its row


async def test_enter_on_a_jobs_line_shows_that_job_and_its_nodes() -> None:
    """A burn (or an efficiency drop) names a job: enter on it puts that job in the
    efficiency strip and the map on the nodes its ranks run on."""
    app = await make_app(16)
    eff = app.efficiency
    other = eff._job("aaa-other")  # sorted first: the strip would show it
    other.world = 1
    job = eff._job("train")
    job.world = 2
    names = sorted(n.name for n in app.cluster.nodes.values())[3:5]
    job.rank_where = {0: (names[0], 0), 1: (names[1], 0)}
    for minute in range(120):  # two hours at SLI 0.05: a page-rate burn
        job.burn.add(eff.now - 7200 + 60 * (minute + 1), 60.0, 3.0)
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        pane = app.query_one("#diagnosis")
        index = next(i for i, g in enumerate(pane.groups) if g.kind == "burn_page")
        await pilot.press("f")
        pane.highlighted = index + 1
        await pilot.press("enter")
        await pilot.pause()
        assert sorted(n.name for n in app.active_map._hm_order) == names
        from tuimon.ui.panels import SloStrip

        assert "train" in str(app.query_one(SloStrip).render())
        assert "filter /job train/" in str(app.query_one("#legend").render())


@pytest.mark.parametrize("width", [80, 200])
async def test_the_strip_says_the_verdict_at_any_width_and_the_waiting_where_it_fits(
        width: int) -> None:
    """A job paging on its burn: at 80 columns the strip keeps the job, its verdict and
    its SLI (it was blank there: the essentials alone were wider than the line); at 200
    it says what the step time waited on and what the budget was spent on."""
    app = await make_app(8)
    eff = app.efficiency
    job = eff._job("train")
    job.world = 8
    now = eff.now
    for minute in range(120):  # two hours at SLI 0.3: a page-rate burn
        ts = now - 7200 + 60 * (minute + 1)
        job.burn.add(ts, 60.0, 18.0, {"comm": 30.0, "data": 9.0})
        job.history.append((ts, 480.0, 144.0, 100))
        job.wait_history.append((ts, {"comm": 240.0, "data": 72.0}))
    job.rank_last = dict.fromkeys(range(8), now)
    job.last_update = now
    async with app.run_test(size=(width, 40)) as pilot:
        await pilot.pause()
        from tuimon.ui.panels import SloStrip

        text = str(app.query_one(SloStrip).render())
        assert "train" in text and "PAGE" in text and "SLI" in text and "0.30" in text, text
        if width == 200:
            assert "waiting 1h: comm 50%, data 15%" in text, text
            assert "spent on comm 1.0 h, data 18 min, other 6 min" in text, text


@pytest.mark.parametrize("size", [(160, 45), (80, 24)])
async def test_the_job_screen_says_what_the_budget_went_to(size: tuple[int, int]) -> None:
    """b opens the strip's job: the budget spent by kind, largest first, the hour's
    waiting, the ranks' spread with the straggler named, the nodes; esc closes."""
    from collections import deque

    app = await make_app(8)
    eff = app.efficiency
    job = eff._job("train")
    job.world = 4
    now = eff.now
    for minute in range(120):
        ts = now - 7200 + 60 * (minute + 1)
        job.burn.add(ts, 60.0, 42.0, {"comm": 12.0, "data": 4.0})
        job.history.append((ts, 240.0, 168.0, 100))
        job.wait_history.append((ts, {"comm": 48.0, "data": 16.0}))
    names = sorted(n.name for n in app.cluster.nodes.values())
    for rank in range(4):
        job.rank_compute[rank] = deque([(now, 1.5 if rank == 2 else 1.0)])
        job.rank_where[rank] = (names[rank // 2], rank % 2)
        job.rank_last[rank] = now
    job.last_update = now
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.press("b")
        await pilot.pause()
        from tuimon.ui.job_screen import JobScreen

        assert isinstance(app.screen, JobScreen)
        text = str(app.screen.query_one("#job-text").render())
        spent = [line.split()[:3] for line in text.splitlines()
                 if re.match(r"  \S+ +[\d.]+ (h|min|s) +\d+%", line)]
        # Under an hour, the budget is said in minutes: 0.6 h of 72 is 36 min.
        assert spent == [["comm", "24", "min"], ["data", "8", "min"], ["other", "4", "min"]], \
            text
        assert "36 min spent" in text, text
        assert "the last hour: 30% of the step time waiting (comm 20%, data 7%)" in text, text
        assert f"slowest 1.500 s (rank 2, {names[1]} GPU 0)" in text, text
        from tuimon_core.hostlist import collect_hostlist

        assert f"nodes  2: {collect_hostlist(names[:2])}" in text, text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, JobScreen)
        # A click on the strip opens it too; `m` there puts the job's nodes on the map.
        await pilot.click("SloStrip")
        await pilot.pause()
        assert isinstance(app.screen, JobScreen)
        await pilot.press("m")
        await pilot.pause()
        assert not isinstance(app.screen, JobScreen)
        assert app.view.filter_text == "job train"
        assert app.active_map.current.name in names[:2]


async def test_the_fleet_screen_groups_the_nodes_by_what_they_are_made_of() -> None:
    import dataclasses

    app = await make_app(8)
    odd = sorted(app.cluster.nodes.values(), key=lambda n: n.name)[2]
    app.cluster.apply_hello(odd.target, dataclasses.replace(odd.hello,
                                                            driver_version="535.129.03"))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("i")
        await pilot.pause()
        from tuimon.ui.fleet_screen import FleetScreen

        assert isinstance(app.screen, FleetScreen)
        text = str(app.screen.query_one("Static").render())
        assert "driver  differs" in text and "535.129.03" in text and odd.name in text
        assert "kernel" in text and "NVLinks active" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, FleetScreen)
        # The same difference is in the diagnosis, naming the node.
        assert [f.nodes for f in app.diagnosis.findings if f.kind == "fleet_skew"] == [
            (odd.name,)]


async def test_the_legend_says_the_map_waits_for_values_not_yet_asked() -> None:
    """A source that asks only what the map draws (tuimon prom) has not asked the new
    map's values right after a switch: the legend says so until they come."""
    app = await make_app(8)
    async with app.run_test(size=(160, 40)) as pilot:
        app.cluster.set_unasked(frozenset({"mem_used", "power"}))  # as its last read left
        await pilot.press("3")  # temperature: always asked
        assert "asking" not in str(app.query_one("#legend").render())
        await pilot.press("2")  # memory used: not asked at the last read
        assert "asking the server" in str(app.query_one("#legend").render())
        app.cluster.set_unasked(frozenset({"power"}))  # the next read asked it
        app.tick()  # the legend follows at the next tick (this app's is an hour away)
        await pilot.pause()
        assert "asking" not in str(app.query_one("#legend").render())


async def test_the_history_screen_lists_the_relays_incidents_and_opens_one(
        tmp_path, unused_tcp_port_factory) -> None:  # type: ignore[no-untyped-def]
    """A relay whose ledger holds the night's incidents (a leaf's congestion that cost a
    job budget, a GPU that throttled and is over): `H` lists them newest first, each a
    bar over the last day with its span and cost; enter on the leaf's filters the map to
    the leaf; `1` asks for the last 6 hours."""
    import time

    from tuimon.commands.connect import history
    from tuimon.relay import Relay, RelayConfig
    from tuimon.relay.ledger import Ledger
    from tuimon.ui.history_screen import HistoryScreen
    from tuimon_core.findings import Finding

    now = time.time()
    clock = [now - 5 * 3600]
    path = tmp_path / "ledger.db"
    with Ledger(path, clock=lambda: clock[0]) as ledger:
        leaf = Finding("warning", "congestion", "congestion concentrated under leaf02: x",
                       leaf="leaf02", nodes=("sim-node008", "sim-node009"), score=1.0,
                       first_seen=clock[0])
        hot = Finding("warning", "thermal", "sim-node003 GPU 1 thermal throttling",
                      node="sim-node003", gpu=1, score=0.4, first_seen=now - 3 * 3600)
        ledger.observe([leaf], clock[0], lambda f: ["llm"])
        ledger.add("llm", clock[0] + 30, 60.0, 30.0, {"comm": 30.0})
        ledger.attribute(lambda job: [leaf])
        clock[0] = now - 3 * 3600
        ledger.observe([hot], clock[0], lambda f: [])
        clock[0] = now - 2 * 3600
        ledger.observe([], clock[0])
    sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    app = await make_app(16)
    async with sim, Relay(RelayConfig(targets=sim.targets, listen="127.0.0.1:0",
                                      ledger=path)) as relay:
        app.history = history([f"127.0.0.1:{relay.port}"], StreamOptions())
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.press("H")
            screen = app.screen
            assert isinstance(screen, HistoryScreen)
            for _ in range(50):
                await pilot.pause(0.1)
                if screen.incidents:
                    break
            rows = [str(screen.query_one("#history-list").get_option_at_index(i).prompt)
                    for i in range(2)]
            assert "thermal sim-node003 GPU 1" in rows[0] and "#" in rows[0], rows
            assert "congestion leaf02" in rows[1] and "of budget (llm)" in rows[1], rows
            options = screen.query_one("#history-list")
            options.focus()
            options.highlighted = 1  # type: ignore[attr-defined]
            await pilot.press("enter")
            await pilot.pause()
            assert app.view.filter_text == "leaf02"
            await pilot.press("H", "1")
            await pilot.pause(0.5)
            assert app.screen.seconds == 6 * 3600  # type: ignore[attr-defined]


async def test_colon_goes_to_a_node_or_a_leaf_by_name() -> None:
    """`:` opens the palette; `node sim-node011` and enter open that node's screen without
    walking the map; `leaf` and a leaf's name filter the map to that leaf; tuimon's own
    keys are commands there too."""
    from textual.command import CommandPalette

    app = await make_app(16)
    leaf = app.view.topology["sim-node011"]
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("colon")
        await pilot.pause()
        assert isinstance(app.screen, CommandPalette)
        commands = {c.title: c.help for c in app.get_system_commands(app.screen_stack[0])}
        assert "history" not in commands  # a key this app cannot use is not offered
        assert {"fleet", "job", "findings", "node sim-node011", f"leaf {leaf}"} <= \
            set(commands)
        assert commands["filter"] == "key /" and commands["help"] == "key ?", commands
        await pilot.press(*"node sim-node011")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.node.name == "sim-node011"
        await pilot.press("escape")
        await pilot.press("colon", *f"leaf {leaf}")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause()
        shown = {n.name for n in app.view.visible(app.cluster)}
        assert shown == {name for name, lf in app.view.topology.items() if lf == leaf}, shown


def test_a_shortened_name_keeps_its_whole_number() -> None:
    """What every name begins with is cut before a number, never into it nor a whole
    name: gpu1 and gpu10 read `1` and `10`; sim-node001 reads `001`."""
    from tuimon.ui.heatmap import _shared_front

    assert _shared_front(["gpu1", "gpu10", "gpu11", "gpu12"]) == 3
    assert _shared_front(["sim-node001", "sim-node002", "sim-node031"]) == 8
    assert _shared_front(["a", "ab"]) == 0


@pytest.mark.parametrize("width", [80, 160])
async def test_each_event_names_its_node_once_at_any_width(width: int) -> None:
    """An agent's own event (its inventory changed) does not name its node in its words,
    a finding's does: on a narrow screen, with no node column, the first gets its node
    before it; on a wide one the second is not named twice."""
    app = await make_app(4)
    cluster = app.cluster
    cluster.events.clear()
    cluster.events.appendleft(ClusterEvent("sim-node001", 1.0, "inventory_changed", "warning",
                                           "inventory changed: port mlx5_2:1 up 1 -> 0"))
    cluster.events.appendleft(ClusterEvent("sim-node002", 2.0, "thermal", "warning",
                                           "sim-node002 GPU 1 thermal throttling"))
    cluster.events.appendleft(ClusterEvent(
        "http://prom:9090", 3.0, "source_lost", "critical",
        "prometheus http://prom:9090: cannot connect: connection refused"))
    async with app.run_test(size=(width, 40)) as pilot:
        app.tick()
        await pilot.pause()
        shown = str(app.query_one(EventsPane).render())
        assert re.search(r"sim-node001\s+inventory changed: port mlx5_2:1", shown), shown
        assert re.search(r"sim-node002\s+GPU 1 thermal throttling", shown), shown
        assert "sim-node002 sim-node002" not in re.sub(r"\s+", " ", shown), shown
        assert "prometheus http://prom:9090: cannot connect" in shown, shown
        if width < 120:  # no node column: what the words name is not said again
            assert shown.count("http://prom:9090") == 1, shown


async def test_under_no_color_the_picked_finding_is_in_reverse_video(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Textual draws an option list's highlight as swapped colours, which NO_COLOR would
    leave as bold alone: the picked finding is drawn in reverse video, the others not."""
    monkeypatch.setenv("NO_COLOR", "1")
    app = await make_app(8)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        pane = app.query_one("#diagnosis")
        assert app.no_color and len(pane.groups) >= 2
        await pilot.press("f")
        await pilot.pause()

        def reversed_line(y: int) -> bool:
            return any(seg.style is not None and seg.style.reverse
                       for seg in pane.render_line(y) if seg.text.strip())
        assert reversed_line(1) and not reversed_line(2)
        await pilot.press("down")
        await pilot.pause()
        assert reversed_line(2) and not reversed_line(1)


async def test_h_without_a_ledger_says_where_the_history_is_kept() -> None:
    app = await make_app(4)
    assert app.history is None
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("H")
        await pilot.pause()
        assert app.screen is app.screen_stack[0]  # no empty history screen
        shown = [n.message for n in app._notifications]
        assert any("relay's ledger keeps the incidents" in m for m in shown), shown
