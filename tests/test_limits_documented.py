"""The table of limits (docs/security.md, "Threat model and limits", once README's) names every limit of the API
and of ingests, with the default the settings really have."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from paperlane.settings import ApiSettings, IngestSettings, Settings

README = Path(__file__).resolve().parents[1] / "docs" / "security.md"  # moved out of README.md
WORKER_LIMITS = {"max_input_bytes", "max_image_pixels", "render_memory_bytes", "render_timeout", "urgent_processes"}
NOT_LIMITS = {"api": {"host", "port", "url_expiry"}, "ingest": {"spool_bytes", "upload_threads"}}
_UNITS = {"MiB": 1 << 20, "GiB": 1 << 30, "MP": 1_000_000, "s": 1}


def _table() -> dict[str, str]:
    """Setting (``api.max_body_bytes``) -> the default the page gives."""
    text = README.read_text()
    section = text[text.index("Every limit, its setting"):]
    end = section.find("\n## ")  # the page's last section runs to its end
    section = section if end < 0 else section[:end]
    rows: dict[str, str] = {}
    for names, default in re.findall(r"^\| (`[^|]+`) \| ([^|]+) \|", section, re.M):
        settings = re.findall(r"`([A-Z_]+)`", names)
        values = [default.strip()] if len(settings) == 1 else [v.strip() for v in default.split(", ")]
        assert len(values) == len(settings), (names, default)
        for name, value in zip(settings, values):
            section_name, _, field = name.lower().partition("__")
            rows[f"{section_name}.{field}"] = value
    return rows


def _value(shown: str) -> Any:
    if shown in ("unset", "false", "true"):
        return {"unset": None, "false": False, "true": True}[shown]
    if shown.startswith(("`[", "`{")):
        return json.loads(shown.strip("`"))
    number, _, unit = shown.partition(" ")
    return float(number.replace(",", "")) * _UNITS.get(unit, 1)


def test_every_limit_is_in_the_readme_with_its_real_default() -> None:
    rows = _table()
    defaults = Settings().model_dump()
    for name, given in rows.items():
        section, field = name.split(".")
        assert field in defaults[section], f"README names {name}, which is no setting"
        assert _value(given) == defaults[section][field], f"{name}: README says {given}, the default is " \
                                                          f"{defaults[section][field]}"
    for section, model in (("api", ApiSettings), ("ingest", IngestSettings)):
        shown = {n.split(".")[1] for n in rows if n.startswith(f"{section}.")}
        missing = set(model.model_fields) - NOT_LIMITS[section] - shown
        assert not missing, f"limits missing from README's table: {section}.{sorted(missing)}"
    missing_worker = WORKER_LIMITS - {n.split(".")[1] for n in rows if n.startswith("worker.")}
    assert not missing_worker, f"worker limits missing from README's table: {sorted(missing_worker)}"
