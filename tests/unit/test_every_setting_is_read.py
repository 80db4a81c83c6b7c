"""Every setting a command offers is read by the code: a flag that does nothing cannot come back.

``--help`` lists every field of ``ServerSettings`` and ``WorkerSettings`` as a flag with its
``CORRAL_*`` twin, so a field nothing reads is a documented switch that silently does nothing
(eleven once were: auth and preemption knobs for features not yet written). A field counts
as read when code outside ``config.py`` reads it from a settings object (``settings.port``,
``self._settings.heartbeat_s``, ``state.settings.db``), or when a method of the settings class
that reads it (``default_budget_s`` reads ``budget_s``) is itself called outside ``config.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

import corral
from corral import config
from corral.config import ServerSettings, WorkerSettings

SOURCE_ROOT = Path(corral.__file__).parent
CONFIG_PATH = Path(config.__file__)


def _names_read_from_settings_objects() -> set[str]:
    """Attributes read off an expression whose last name ends in ``settings``, outside config.py."""
    names: set[str] = set()
    for path in SOURCE_ROOT.rglob("*.py"):
        if path == CONFIG_PATH:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if owner_name.lower().endswith("settings"):
                names.add(node.attr)
    return names


def _fields_read_by_methods(settings_class: type[BaseSettings]) -> dict[str, set[str]]:
    """For each method defined on the class in config.py: the ``self.<field>`` it reads."""
    tree = ast.parse(CONFIG_PATH.read_text())
    (class_node,) = (
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == settings_class.__name__
    )
    reads: dict[str, set[str]] = {}
    for method in class_node.body:
        if isinstance(method, ast.FunctionDef):
            reads[method.name] = {
                node.attr
                for node in ast.walk(method)
                if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            }
    return reads


@pytest.mark.parametrize("settings_class", [ServerSettings, WorkerSettings], ids=lambda cls: cls.__name__)
def test_every_setting_is_read_outside_config(settings_class: type[BaseSettings]) -> None:
    read = _names_read_from_settings_objects()
    for method, fields in _fields_read_by_methods(settings_class).items():
        if method in read:
            read |= fields
    unread = sorted(set(settings_class.model_fields) - read)
    assert unread == [], (
        f"{settings_class.__name__} offers settings nothing reads: {unread}. Remove them (and their "
        "mention in README / --help) until the code that honours them lands."
    )


def test_the_check_sees_a_setting_read_only_through_a_method() -> None:
    # budget_s is read only by WorkerSettings.default_budget_s, which the worker calls.
    assert "budget_s" in _fields_read_by_methods(WorkerSettings)["default_budget_s"]
    assert "budget_s" not in _names_read_from_settings_objects()
    assert "default_budget_s" in _names_read_from_settings_objects()
