"""The layers hold: the headless halves never import textual (agent/, tuimon/model/,
tuimon/sources/, tuimon/relay/, the views' text tuimon/text/ and the text front ends
tuimon/*.py), every file's imports keep to its layer (CONTRACT, which places every file
of the repository), and the views write to the model only what they want of it."""

from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import agent
import tuimon.model
import tuimon.relay
import tuimon.sources
import tuimon.text

ROOT = Path(__file__).resolve().parent.parent


def _modules(package) -> list[str]:  # type: ignore[no-untyped-def]
    names = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith(".__main__"):  # importing it would run the agent
            names.append(info.name)
    return names


def test_headless_packages_do_not_import_textual() -> None:
    front_ends = [f"tuimon.{p.stem}" for p in sorted((ROOT / "tuimon").glob("*.py"))
                  if area_of(f"tuimon/{p.name}") == TOP and p.stem != "__init__"]
    modules = (_modules(agent) + _modules(tuimon.model) + _modules(tuimon.sources)
               + _modules(tuimon.relay) + _modules(tuimon.text) + front_ends)
    assert "agent.node" in modules and "tuimon.relay.server" in modules
    assert "tuimon.text.job_text" in modules and "tuimon.status" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "", f"textual imported by headless code: {out.stdout}"


def test_no_textual_import_statement_in_headless_sources() -> None:
    offenders = []
    for folder in (ROOT / "agent", ROOT / "tuimon" / "model", ROOT / "tuimon" / "sources",
                   ROOT / "tuimon" / "relay", ROOT / "tuimon" / "text"):
        for path in folder.rglob("*.py"):
            for line in path.read_text().splitlines():
                stripped = line.strip()
                if stripped.startswith(("import textual", "from textual")):
                    offenders.append(f"{path.relative_to(ROOT)}: {stripped}")
    assert not offenders


# -- the import contract ----------------------------------------------------------------
# Who may import whom, checked on every import statement (function-level, TYPE_CHECKING
# and relative ones too). Every Python file of the repository lies in one area: the first
# key of CONTRACT that holds it ("x/": the folder x and everything below it; "x/*.py": the
# files directly in x; a `*` matches within one name). A file may import its own area's
# modules and those of the areas its rule lists, and nothing else of agent, tuimon,
# tuimon_core, textual or rich (other third-party packages are not the contract's). A
# file in no area fails test_every_file_lies_in_an_area: a new package or command module
# is placed here before it lands.
#
#   tuimon_core    -> nothing of ours (agents, relays and viewers all build on it)
#   agent          -> tuimon_core (a compute node's install has no viewer)
#   tuimon/model   -> tuimon_core (views and feeds read the model; it knows neither)
#   tuimon/sources -> the model: they feed it (agent_stream.StreamSink, which ClusterState
#                     implements; a replay's controls are the model's view_state)
#   tuimon/relay   -> sources and model (it watches agents as a viewer does)
#   tuimon/text    -> the model: the views' text with no Textual (job_text, incident_text,
#                     burn_plot, sparkline, severity, markup), shared by the screens and
#                     the text commands
#   tuimon/ui      -> text, model, textual, rich: the views read the model and draw it;
#                     what they tell it is the model's ViewWants (see the test below), a
#                     replay's keys set the model's ReplayControl; no source, no relay, no
#                     command and no top-level module (the log's path is tuimon_core.logs')
#   tuimon/*.py    -> sources, text, model: the text front ends and what the commands
#                     share (status, readout, prom_judge, config, app_log, manual,
#                     snapshot_waits); no Textual view, no relay, no command
#   the wiring     -> anything: the commands build the model, start the sources, open the
#                     views or serve the relay. Whatever the command modules are called:
#                     tuimon/cli.py, a tuimon/cli/ or tuimon/commands/ package, or a
#                     tuimon/*command*.py module (prom_judge_command.py); nothing but the
#                     wiring imports them
#   bench/, examples/, tests/ -> anything: benchmarks and tests drive every layer, and
#                     the examples are user code (a training job's callbacks)
ANYTHING = None
CORE, AGENT, MODEL, SOURCES, RELAY, TEXT, UI, TOP = (
    "tuimon_core/", "agent/", "tuimon/model/", "tuimon/sources/", "tuimon/relay/",
    "tuimon/text/", "tuimon/ui/", "tuimon/*.py")
CONTRACT: dict[str, tuple[str, ...] | None] = {
    "tuimon/cli.py": ANYTHING,
    "tuimon/cli/": ANYTHING,
    "tuimon/commands/": ANYTHING,
    "tuimon/*command*.py": ANYTHING,
    CORE: (),
    AGENT: (CORE,),
    MODEL: (CORE,),
    SOURCES: (MODEL, CORE),
    RELAY: (SOURCES, MODEL, CORE),
    TEXT: (MODEL, CORE),
    UI: (TEXT, MODEL, CORE, "textual", "rich"),
    TOP: (SOURCES, TEXT, MODEL, CORE),
    "bench/": ANYTHING,
    "examples/": ANYTHING,
    "tests/": ANYTHING,
}
FIRST_PARTY = ("agent", "tuimon", "tuimon_core")
GUARDED = ("textual", "rich")  # the screen's packages: only the views' area lists them
_PATTERNS = [(re.compile(re.escape(key).replace(r"\*", "[^/]*")
                         + (".*" if key.endswith("/") else "")), key) for key in CONTRACT]


def area_of(rel: str) -> str | None:
    """The CONTRACT key a file (a path from the root, with /) lies in; None: in none."""
    return next((key for pattern, key in _PATTERNS if pattern.fullmatch(rel)), None)


def _python_files(root: Path) -> list[Path]:
    """Every Python file of the repository (not a virtualenv's, a build's or a cache's)."""
    out = sorted(root.glob("*.py"))
    for top in sorted(p for p in root.iterdir() if p.is_dir()):
        if (top.name.startswith((".", "_")) or top.name in ("build", "dist")
                or top.name.endswith(".egg-info") or (top / "pyvenv.cfg").exists()):
            continue
        out += sorted(p for p in top.rglob("*.py") if "__pycache__" not in p.parts)
    return out


def _is_package(parts: list[str], root: Path) -> bool:
    return any((r / "/".join(parts)).is_dir() for r in (root, ROOT))


def _is_module(parts: list[str], root: Path) -> bool:
    return _is_package(parts, root) or any(
        (r / "/".join(parts)).with_suffix(".py").is_file() for r in (root, ROOT))


def _imports(path: Path, rel: str, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every import: `from package import module` names the module, and
    a relative import is read from the file's package."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") if node.module else []
            if node.level:
                package = rel.split("/")[:-1]
                parts = package[:len(package) - node.level + 1] + parts
            if not parts:
                continue
            if _is_package(parts, root):
                subs = [a.name for a in node.names if _is_module([*parts, a.name], root)]
                if subs:
                    out += [(node.lineno, ".".join([*parts, sub])) for sub in subs]
                    continue
            out.append((node.lineno, ".".join(parts)))
    return out


def _module_area(module: str, root: Path) -> str | None:
    """The area an imported module lies in: a guarded package's name, "" for one of ours
    in no area, None for another third-party package (not the contract's)."""
    parts = module.split(".")
    if parts[0] in GUARDED:
        return parts[0]
    if parts[0] not in FIRST_PARTY:
        return None
    rel = "/".join(parts) + ("/__init__.py" if _is_package(parts, root) else ".py")
    return area_of(rel) or ""


def contract_violations(root: Path = ROOT) -> list[str]:
    bad = []
    for path in _python_files(root):
        rel = path.relative_to(root).as_posix()
        area = area_of(rel)
        may = CONTRACT.get(area or "", ANYTHING)
        if may is ANYTHING:
            continue  # the wiring, or free (no area: test_every_file_lies_in_an_area)
        for line, module in _imports(path, rel, root):
            to = _module_area(module, root)
            if to is not None and to != area and to not in may:
                bad.append(f"{rel}:{line}: imports {module}")
    return bad


def unplaced_files(root: Path = ROOT) -> list[str]:
    """Python files in no area of the contract."""
    return [rel for p in _python_files(root)
            if area_of(rel := p.relative_to(root).as_posix()) is None]


def test_the_import_contract_holds() -> None:
    assert contract_violations() == []


def test_every_file_lies_in_an_area() -> None:
    assert unplaced_files() == [], "place these in CONTRACT (a layer, or the wiring)"
    placed = {area_of(p.relative_to(ROOT).as_posix()) for p in _python_files(ROOT)}
    layers = {key for key, may in CONTRACT.items() if may is not ANYTHING}
    assert layers <= placed, f"areas that hold no file: {sorted(layers - placed)}"
    assert area_of("tuimon/ui/app.py") == UI and area_of("tuimon/status.py") == TOP
    # The command modules are the wiring, whatever the split of the command line names
    # them; the relay's own command module is the relay's.
    for wiring in ("tuimon/cli.py", "tuimon/prom_judge_command.py", "tuimon/commands/x.py",
                   "tuimon/cli/x.py"):
        assert CONTRACT[area_of(wiring) or ""] is ANYTHING, wiring
    assert area_of("tuimon/relay/command.py") == RELAY


def test_the_import_contract_catches_a_breach(tmp_path: Path) -> None:
    # The check itself can fail: a model module importing a source is reported.
    (tmp_path / "tuimon" / "model").mkdir(parents=True)
    (tmp_path / "tuimon" / "model" / "leak.py").write_text(
        "def f():\n    from tuimon.sources.targets import parse_targets\n")
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "x.py").write_text("import tuimon.relay\n")
    assert contract_violations(tmp_path) == [
        "agent/x.py:1: imports tuimon.relay",
        "tuimon/model/leak.py:2: imports tuimon.sources.targets"]


def test_the_views_and_front_ends_are_held_to_their_layers(tmp_path: Path) -> None:
    # The breaches the contract once let through, planted: a view that imports a source
    # and a top-level module, a text front end that imports a Textual view, the views'
    # text importing Textual, a view importing a command; the wiring imports anything.
    def plant(rel: str, text: str) -> None:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)

    plant("tuimon/ui/player.py", "from tuimon.sources.recording import replay\n"
                                 "from tuimon.app_log import log_to_file\n"
                                 "from tuimon.model.view_state import ReplayControl\n"
                                 "from tuimon.text.markup import safe\n"
                                 "import textual\n")
    plant("tuimon/status.py", "from tuimon.model.job_report import job_report\n"
                              "from tuimon.ui.job_screen import JobScreen\n"
                              "from tuimon.relay import build_relay\n"
                              "from tuimon.text.job_text import job_text\n"
                              "from tuimon.readout import render\n")
    plant("tuimon/text/lines.py", "from rich.cells import cell_len\n"
                                  "from tuimon import ui\n")
    plant("tuimon/ui/menu.py", "from tuimon.commands.report import run\n"
                               "from . import player\n"
                               "from ..cli import main\n")
    plant("tuimon/commands/watch.py", "from tuimon.ui.app import TuimonApp\n"
                                      "from tuimon.relay import build_relay\n")
    plant("tuimon/prom_judge_command.py", "from tuimon.prom_judge import PromJudge\n")
    plant("tuimon/cli.py", "from tuimon.commands import watch\n")
    assert contract_violations(tmp_path) == [
        "tuimon/status.py:2: imports tuimon.ui.job_screen",
        "tuimon/status.py:3: imports tuimon.relay",
        "tuimon/text/lines.py:1: imports rich.cells",
        "tuimon/text/lines.py:2: imports tuimon.ui",
        "tuimon/ui/menu.py:1: imports tuimon.commands.report",
        "tuimon/ui/menu.py:3: imports tuimon.cli",
        "tuimon/ui/player.py:1: imports tuimon.sources.recording",
        "tuimon/ui/player.py:2: imports tuimon.app_log"]
    # A new package, or a module in a new folder, lies in no area until it is placed.
    plant("tuimon/plugins/x.py", "")
    plant("setup.py", "")
    assert unplaced_files(tmp_path) == ["setup.py", "tuimon/plugins/x.py"]


# -- the views only read the model --------------------------------------------------------
# What a view tells the model is the model's ViewWants (tuimon/model/view_state.py, which
# ClusterState implements: the nodes it looks at closely, the fields its map draws); any
# other call a view makes on the ClusterState (held as `cluster` or `x.cluster`) is one of
# these reads, and no view sets an attribute of it. A read the views start to make is
# added here; a write is not.
CLUSTER_READS = frozenset({
    "counts", "gpu_total", "interval", "relayed_findings", "asking", "owner_of",
    # told when a source has applied a whole read (tuimon prom): a view draws it then
    "add_read_listener", "remove_read_listener"})
VIEW_AREAS = (UI, TEXT)


def _wants() -> frozenset[str]:
    from tuimon.model.view_state import ViewWants

    return frozenset(n for n, v in vars(ViewWants).items()
                     if callable(v) and not n.startswith("_"))


def _is_cluster(node: ast.expr) -> bool:
    return ((isinstance(node, ast.Name) and node.id == "cluster")
            or (isinstance(node, ast.Attribute) and node.attr == "cluster"))


def view_writes(root: Path = ROOT) -> list[str]:
    from tuimon.model.cluster import ClusterState

    methods = {n for n in dir(ClusterState) if not n.startswith("_")
               and callable(getattr(ClusterState, n))}
    may = CLUSTER_READS | _wants()
    bad = []
    for path in _python_files(root):
        rel = path.relative_to(root).as_posix()
        if area_of(rel) not in VIEW_AREAS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and _is_cluster(node.func.value) and node.func.attr in methods
                    and node.func.attr not in may):
                bad.append(f"{rel}:{node.lineno}: calls cluster.{node.func.attr}")
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                       else [])
            for t in targets:
                while isinstance(t, ast.Subscript):
                    t = t.value
                if isinstance(t, ast.Attribute) and _is_cluster(t.value):
                    bad.append(f"{rel}:{node.lineno}: sets cluster.{t.attr}")
    return sorted(bad, key=lambda b: (b.split(":")[0], int(b.split(":")[1])))


def test_the_views_write_to_the_model_only_what_they_want_of_it() -> None:
    from tuimon.model.cluster import ClusterState

    assert _wants() == {"set_detail", "set_drawn"}
    assert not CLUSTER_READS - set(dir(ClusterState)), "a read ClusterState no longer has"
    assert view_writes() == []


def test_a_view_that_writes_to_the_model_is_caught(tmp_path: Path) -> None:
    (tmp_path / "tuimon" / "ui").mkdir(parents=True)
    (tmp_path / "tuimon" / "ui" / "bad.py").write_text(
        "def f(self, cluster, node):\n"
        "    cluster.set_detail({node})\n"  # ViewWants: allowed
        "    self.cluster.apply_message(node, None)\n"
        "    self.app.cluster.mark_stale(node, 'x')\n"
        "    cluster.version += 1\n"
        "    self.cluster.budgets['job'] = {}\n"
        "    self.styles.clear()\n")  # not the model's
    assert view_writes(tmp_path) == [
        "tuimon/ui/bad.py:3: calls cluster.apply_message",
        "tuimon/ui/bad.py:4: calls cluster.mark_stale",
        "tuimon/ui/bad.py:5: sets cluster.version",
        "tuimon/ui/bad.py:6: sets cluster.budgets"]


def _loaded(code: str, which: str) -> list[str]:
    """The modules that running `code` in a fresh interpreter loads and that `which` (a
    condition on a module's name, `m`) picks."""
    script = f"import sys\n{code}\nprint(','.join(sorted(m for m in sys.modules if {which})))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_importing_every_agent_module_loads_nothing_of_the_viewer() -> None:
    modules = _modules(agent)
    bad = _loaded("import importlib\n"
                  f"for name in {modules!r}:\n"
                  "    importlib.import_module(name)",
                  "m == 'tuimon' or m.startswith('tuimon.') "
                  "or m.split('.')[0] in ('textual', 'rich')")
    assert bad == [], f"the agent loaded viewer modules: {bad}"


def test_the_command_line_parses_without_loading_the_relay_server_or_the_app() -> None:
    """Every `tuimon` command starts by building the parser of all of them: a quick
    `status` or `--once` over SSH must not first load the relay's server or Textual
    (measured: the relay's server was 0.2 s of a 0.6-0.9 s start)."""
    heavy = ("tuimon.relay.relay", "tuimon.relay.server", "tuimon.relay.ledger",
             "aiohttp.web", "textual")
    loaded = _loaded("from tuimon.commands.parser import build_parser\n"
                     "import tuimon.cli\n"
                     "build_parser().parse_args(['relay', 'gpu[1-2]'])",
                     f"m in {heavy!r}")
    assert loaded == [], f"the command line loaded: {loaded}"
    # The names the relay's package gives are still there, loaded when read.
    from tuimon.relay import DEFAULT_RELAY_PORT, LedgerError, Relay, RelayConfig, build_relay
    assert Relay.__module__ == RelayConfig.__module__ == build_relay.__module__ \
        == "tuimon.relay.relay"
    assert issubclass(LedgerError, Exception) and DEFAULT_RELAY_PORT > 0
