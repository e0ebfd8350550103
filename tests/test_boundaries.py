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
