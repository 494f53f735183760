"""docs/configuration.md is what scripts/config_reference.py writes from the settings class: it cannot drift."""

from __future__ import annotations

import runpy
from pathlib import Path

from paperlane.settings import Settings

REPO = Path(__file__).resolve().parents[1]
GENERATOR = runpy.run_path(str(REPO / "scripts" / "config_reference.py"))


def test_the_configuration_reference_is_what_the_settings_generate() -> None:
    written = (REPO / "docs" / "configuration.md").read_text()
    assert written == GENERATOR["render"](), "docs/configuration.md is stale: run scripts/config_reference.py"


def test_every_setting_has_its_row_with_its_default() -> None:
    page = GENERATOR["render"]()
    for section, model in Settings.model_fields.items():
        fields = getattr(model.annotation, "model_fields", None)
        for name in fields or [section]:
            variable = f"PAPERLANE_{section.upper()}__{name.upper()}" if fields else f"PAPERLANE_{section.upper()}"
            assert f"| `{variable}`" in page or f"| `{variable}__" in page, variable
    assert "| `PAPERLANE_WORKER__BATCH_WAIT` | float | `0.25` |" in page
