"""Limits and entitlements files (`metering/limits/files.py`), read without a
database: YAML or TOML, a mapping of names or a list of entries (under a
``limits``/``entitlements`` key or not); every bad entry named at once; a
key given twice, a file nested too deep, not UTF-8 or of another kind is one
error naming the file."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from metering.domain.limits import Limit
from metering.errors import ConfigurationError, InvalidInput, InvalidLimit
from metering.limits.files import (
    MAX_FILE_DEPTH,
    EntitlementEntry,
    limits_from_data,
    load_entitlements_file,
    load_limits_file,
)

CALLS = Limit("calls", maximum=5, period="1h")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_forms_of_a_limits_file(tmp_path: Path) -> None:
    forms = {
        "map.yaml": "calls: {maximum: 5, period: 1h}\n",
        "keyed.yml": "limits:\n  calls: {maximum: 5, period: 1h}\n",
        "list.yaml": "- {name: calls, maximum: 5, period: 1h}\n",
        "tables.toml": '[[limits]]\nname = "calls"\nmaximum = 5\nperiod = "1h"\n',
        "named.toml": '[limits.calls]\nmaximum = 5\nperiod = "1h"\n',
    }
    for name, text in forms.items():
        assert load_limits_file(write(tmp_path, name, text)) == [CALLS], name
    assert limits_from_data({"limits": [{"name": "calls", "maximum": 5, "period": "1h"}]}, "body")


def test_every_bad_entry_is_named_at_once(tmp_path: Path) -> None:
    text = "a: {maximum: 0, period: 1h}\nb: {maximum: 5, period: 2x}\nc: {maximum: 5, period: 1h}\n"
    with pytest.raises(InvalidLimit, match="2 bad entries") as raised:
        load_limits_file(write(tmp_path, "limits.yaml", text))
    assert "limit a: " in str(raised.value) and "limit b: " in str(raised.value)
    twice = "- {name: c, maximum: 5, period: 1h}\n- {name: c, maximum: 6, period: 1h}\n"
    with pytest.raises(InvalidLimit, match="limit c is defined twice"):
        load_limits_file(write(tmp_path, "twice.yaml", twice))
    with pytest.raises(ConfigurationError, match="is not a mapping of fields"):
        load_limits_file(write(tmp_path, "shape.yaml", "d: 7\n"))
    with pytest.raises(ConfigurationError, match="expected a mapping or a list"):
        load_limits_file(write(tmp_path, "scalar.yaml", "7\n"))


def test_a_file_that_cannot_be_read_as_limits_is_one_error_naming_it(tmp_path: Path) -> None:
    cases = {
        "limits.json": ('{"calls": {}}', "use a .yaml, .yml or .toml file"),
        "twice.yaml": ("a: 1\nb: 2\na: 3\n", "key 'a' is repeated (first on line 1)"),
        "broken.toml": ("[[limits]\n", "not valid TOML"),
        "deep.yaml": ("x: " + "[" * (MAX_FILE_DEPTH + 2) + "]" * (MAX_FILE_DEPTH + 2), "nested"),
    }
    for name, (text, message) in cases.items():
        path = write(tmp_path, name, text)
        with pytest.raises(ConfigurationError, match=re.escape(message)) as raised:
            load_limits_file(path)
        assert str(path) in str(raised.value), name
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("calls: {maximum: 5, period: 1h} # é\n".encode("latin-1"))
    with pytest.raises(ConfigurationError, match="not UTF-8 text"):
        load_limits_file(latin)
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_limits_file(tmp_path / "missing.yaml")


def test_an_entitlements_file_is_a_list_of_entries(tmp_path: Path) -> None:
    text = (
        "entitlements:\n"
        "  - {subject: org-1, limit: calls, maximum: 50}\n"
        "  - {subject: org-1, limit: calls, maximum: 80, effective_from: 2026-12-01}\n"
    )
    first, later = load_entitlements_file(write(tmp_path, "e.yaml", text))
    assert first == EntitlementEntry("org-1", "calls", 50, None, first.where)
    assert later.effective_from == datetime(2026, 12, 1, tzinfo=UTC)  # a date: its UTC midnight
    assert "entry 2" in later.where
    repeated = (
        "- {subject: a, limit: calls, maximum: 1}\n- {subject: a, limit: calls, maximum: 2}\n"
    )
    with pytest.raises(InvalidInput, match="repeats"):
        load_entitlements_file(write(tmp_path, "r.yaml", repeated))
    with pytest.raises(InvalidInput, match="expected a list of entitlements"):
        load_entitlements_file(write(tmp_path, "m.yaml", "a: 1\n"))
