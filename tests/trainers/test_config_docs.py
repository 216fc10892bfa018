"""docs/config.md is rendered from the config classes' field help, and every field has some."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from searchgym.envs.config_base import field_help
from searchgym.envs.rewards import REWARDS
from searchgym.trainers.config_docs import SECTIONS, render

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_page_is_the_rendered_field_help():
    page = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert page == render(), (
        "docs/config.md is stale: python -m searchgym.trainers.config_docs > docs/config.md"
    )


@pytest.mark.parametrize("key,cls", SECTIONS, ids=[key for key, _ in SECTIONS])
def test_every_field_of_every_section_has_help(key, cls):
    documented = field_help(cls)
    missing = [f.name for f in dataclasses.fields(cls) if f.init and not documented.get(f.name)]
    assert not missing, f"{key}: no help text for {missing} (add them to the class's Attributes:)"


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_every_reward_parameter_has_help(name):
    cls = REWARDS[name]
    documented = field_help(cls, "Args")
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert [p for p in params if not documented.get(p)] == []


def test_a_field_without_help_is_found():
    @dataclasses.dataclass
    class Section:
        """A section.

        Attributes:
            a: Documented,
                on two lines.
        """

        a: int = 0
        b: int = 0

    assert field_help(Section) == {"a": "Documented, on two lines."}


def test_the_page_lists_each_section_and_scheme():
    page = render()
    for key, _ in SECTIONS[1:]:
        assert f"## `{key}`" in page
    for name in REWARDS:
        assert f"### `{name}`" in page
