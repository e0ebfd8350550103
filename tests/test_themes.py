"""Theme files: every packaged theme loads, user themes join, broken files are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuimon.ui.theme_files import (
    REQUIRED_VARIABLES,
    ThemeFileError,
    load_theme_file,
    load_themes,
    packaged_theme_dir,
)


def test_packaged_themes_load_with_the_full_heat_scale() -> None:
    themes, problems = load_themes()
    names = {t.name for t in themes}
    assert {"tuimon-dark", "tuimon-light", "tuimon-high-contrast", "tuimon-viridis",
            "tuimon-cividis"} <= names
    assert problems == []
    for theme in themes:
        assert set(REQUIRED_VARIABLES) <= set(theme.variables)


def test_user_themes_from_the_config_directory(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    folder = tmp_path / "tuimon" / "themes"
    folder.mkdir(parents=True)
    text = (packaged_theme_dir() / "dark.toml").read_text().replace(
        'name = "tuimon-dark"', 'name = "my-night"')
    (folder / "night.toml").write_text(text)
    (folder / "broken.toml").write_text("name = [unclosed\n")
    themes, problems = load_themes()
    assert "my-night" in {t.name for t in themes}
    assert len(problems) == 1 and "broken.toml" in problems[0] and "TOML" in problems[0]


def test_missing_heat_variables_are_named(tmp_path: Path) -> None:
    f = tmp_path / "half.toml"
    f.write_text('name = "half"\nprimary = "#ffffff"\n[variables]\nheat-0 = "#000000"\n')
    with pytest.raises(ThemeFileError, match=r"half\.toml.*heat-1"):
        load_theme_file(f)
