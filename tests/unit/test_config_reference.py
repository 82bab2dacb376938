"""docs/configuration.md's reference is the declaration's: it cannot drift from the models."""

from __future__ import annotations

from pathlib import Path

from boxqueue.config_model import Config, ReplicationConfig, ZaqarConfig
from boxqueue.config_reference import BEGIN, END, render, rewrite

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_page_holds_the_reference_of_todays_declarations() -> None:
    page = PAGE.read_text()
    assert page == rewrite(page), (
        "docs/configuration.md disagrees with boxqueue/config_model.py: "
        "run `python -m boxqueue.config_reference docs/configuration.md` (make docs)"
    )
    generated = page.split(BEGIN, 1)[1].split(END, 1)[0]
    assert generated.strip() == render().strip()


def test_every_key_is_in_the_reference_with_its_default_and_meaning() -> None:
    reference = render()
    for model in (Config, ZaqarConfig, ReplicationConfig):
        for name, field in model.model_fields.items():
            assert f"| `{field.alias or name}` |" in reference
            assert field.description, f"{model.__name__}.{name} has no meaning to show"
    assert "| `max_waiting_takes_per_connection` | integer, at least 1 | `512` |" in reference
    assert "### `iproto.tls`, `zaqar.tls`, `sonya.tls`, `metrics.tls`" in reference
    assert '| `mode` | `"fsync"` \\| `"write"` \\| `"none"` | `"fsync"` |' in reference


def test_a_changed_declaration_shows_as_a_changed_page() -> None:
    page = PAGE.read_text()
    stale = page.replace("| `768` |", "| `769` |")
    assert stale != page and rewrite(stale) == page
