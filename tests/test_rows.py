"""The typed rows are the name table's: tuimon_core/protocol/rows.py is what rows_gen
writes from fields.py now, and a key misspelt where a row is read is a type error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tuimon_core.protocol import rows_gen

ROOT = Path(__file__).resolve().parent.parent


def test_the_rows_are_written_from_the_name_table_as_it_is() -> None:
    assert rows_gen.OUT.read_text() == rows_gen.source(), (
        "run: python -m tuimon_core.protocol.rows_gen")


def test_a_misspelt_key_of_a_typed_row_is_a_type_error(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    # As the readers read them: a value compared or summed. A misspelt key's .get is an
    # `object` (mypy's), which no comparison takes; a right one is its field's type.
    probe.write_text("from tuimon_core.protocol.rows import GpuRow, PortRow\n"
                     "def hot(g: GpuRow) -> bool:\n"
                     "    return (g.get('temp') or 0) > 80\n"
                     "def up(p: PortRow) -> bool:\n"
                     "    return (p.get('state') or 0) == 4\n"
                     "def hot_misspelt(g: GpuRow) -> bool:\n"
                     "    return (g.get('tempp') or 0) > 80\n"
                     # A row within a row is typed too: a GPU's MIG instances.
                     "def mig_busy(g: GpuRow) -> float:\n"
                     "    return sum(m.get('sm_activ') or 0.0 for m in g.get('mig') or [])\n")
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", str(probe)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1, out.stdout
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert [e.split(":")[1] for e in errors] == ["7", "9"], out.stdout
