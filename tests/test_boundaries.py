"""The headless halves never import textual: agent/, tuimon/model/, tuimon/sources/,
tuimon/relay/."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import agent
import tuimon.model
import tuimon.relay
import tuimon.sources

ROOT = Path(__file__).resolve().parent.parent


def _modules(package) -> list[str]:  # type: ignore[no-untyped-def]
    names = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith(".__main__"):  # importing it would run the agent
            names.append(info.name)
    return names


def test_headless_packages_do_not_import_textual() -> None:
    modules = (_modules(agent) + _modules(tuimon.model) + _modules(tuimon.sources)
               + _modules(tuimon.relay))
    assert "agent.node" in modules and "tuimon.relay.server" in modules
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
                   ROOT / "tuimon" / "relay"):
        for path in folder.rglob("*.py"):
            for line in path.read_text().splitlines():
                stripped = line.strip()
                if stripped.startswith(("import textual", "from textual")):
                    offenders.append(f"{path.relative_to(ROOT)}: {stripped}")
    assert not offenders


# -- the import contract ----------------------------------------------------------------
# Who may import whom, checked on every import statement (function-level ones too):
#   tuimon_core  -> neither agent nor tuimon (both halves build on it)
#   agent        -> not tuimon (a compute node's install has no viewer)
#   tuimon.model -> not tuimon.sources, tuimon.ui, tuimon.relay (views and feeds read the
#                   model; the model knows neither)
#   tuimon.sources, tuimon.relay -> not tuimon.ui
CONTRACT: dict[str, tuple[str, ...]] = {
    "tuimon_core": ("agent", "tuimon", "textual"),
    "agent": ("tuimon", "textual"),
    "tuimon/model": ("tuimon.sources", "tuimon.ui", "tuimon.relay", "tuimon.cli", "textual"),
    "tuimon/sources": ("tuimon.ui", "tuimon.relay", "tuimon.cli", "textual"),
    "tuimon/relay": ("tuimon.ui", "tuimon.cli", "textual"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    import ast

    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def _forbidden(module: str, banned: tuple[str, ...]) -> bool:
    return any(module == b or module.startswith(b + ".") for b in banned)


def contract_violations(root: Path = ROOT) -> list[str]:
    bad = []
    for folder, banned in CONTRACT.items():
        for path in sorted((root / folder).rglob("*.py")):
            for line, module in _imports(path):
                if _forbidden(module, banned):
                    bad.append(f"{path.relative_to(root)}:{line}: imports {module}")
    return bad


def test_the_import_contract_holds() -> None:
    assert contract_violations() == []


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


def test_importing_every_agent_module_loads_nothing_of_the_viewer() -> None:
    modules = _modules(agent)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'tuimon' or m.startswith('tuimon.')\n"
        "             or m.split('.')[0] in ('textual', 'rich'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "", f"the agent loaded viewer modules: {out.stdout}"
