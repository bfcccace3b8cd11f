"""Limits and entitlements files (YAML or TOML), read and validated: every
entry is checked before any is returned, and an error names the entry and
its field. Storing them is `metering.limits.service.load_limits` and
`metering.allowances.service.load_entitlements`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any, Final

import yaml

from metering.domain.bounds import shown
from metering.domain.events import validate_subject
from metering.domain.grants import validate_amount
from metering.domain.instants import as_utc, parse_instant, to_us
from metering.domain.limits import MAX_MAXIMUM, Limit, validate_limit_name
from metering.errors import ConfigurationError, InvalidInput, InvalidLimit

# Deeper than any limits or entitlements file needs; refused before anything
# walks the data (a parser or a validator would recurse on it).
MAX_FILE_DEPTH: Final = 32


class DuplicateKey(yaml.YAMLError):
    """A YAML mapping names a key twice (PyYAML keeps the last, silently)."""

    def __init__(self, key: object, line: int, first_line: int) -> None:
        super().__init__(f"line {line}: key {shown(key)} is repeated (first on line {first_line})")


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping
    (merge keys, ``<<``, still override as YAML defines)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in first_lines:
                    raise DuplicateKey(key, line, first_lines[key])
                first_lines[key] = line
            except TypeError:  # an unhashable key: construct_mapping says so
                break
        return super().construct_mapping(node, deep)


def _depth(data: Any) -> int:
    """How deeply lists and mappings nest in ``data`` (a scalar is 0), without recursion."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, Mapping):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_FILE_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _read_document(path: Path) -> Any:
    """A YAML (.yaml/.yml) or TOML (.toml) file's data, or a one-line error."""
    if path.suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigurationError(f"{path}: use a .yaml, .yml or .toml file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
        ) from None
    kind = path.suffix[1:].upper()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except (tomllib.TOMLDecodeError, yaml.YAMLError, ValueError) as exc:
        # ValueError: YAML reads 2026-13-01 as a date, and stops at an impossible one.
        raise ConfigurationError(f"{path}: not valid {kind}: {exc}") from exc
    except RecursionError:
        raise ConfigurationError(f"{path}: nested more than {MAX_FILE_DEPTH} levels deep") from None
    if _depth(data) > MAX_FILE_DEPTH:
        raise ConfigurationError(f"{path}: nested more than {MAX_FILE_DEPTH} levels deep")
    return data


def load_limits_file(path: str | Path) -> list[Limit]:
    """Read limits from a YAML (.yaml/.yml) or TOML (.toml) file.

    Either form works: a mapping of name to fields (optionally under a
    top-level ``limits`` key), or a list of entries that each have a ``name``.
    Every entry is validated before any is returned.
    """
    path = Path(path)
    return limits_from_data(_read_document(path), path)


def limits_from_data(data: Any, path: Path | str) -> list[Limit]:
    """`load_limits_file` of data already read (a JSON body): ``path`` names it in errors."""
    if isinstance(data, Mapping) and "limits" in data:
        data = data["limits"]
    return _limits_from(data, path)


NOT_A_MAPPING: Final = "is not a mapping of fields"


def _limits_from(data: Any, path: Path | str) -> list[Limit]:
    entries: list[tuple[str | None, Any]]
    if isinstance(data, Mapping):
        entries = [(str(name), fields) for name, fields in data.items()]
    elif isinstance(data, list):
        entries = [(None, fields) for fields in data]
    else:
        raise ConfigurationError(f"{path}: expected a mapping or a list of limits")
    found: list[Limit] = []
    problems: list[str] = []
    for name, fields in entries:
        if not isinstance(fields, Mapping):
            problems.append(f"limit {name or '?'} {NOT_A_MAPPING}")
            continue
        try:
            found.append(Limit.from_dict(fields, name=name))
        except (InvalidLimit, TypeError) as exc:
            problems.append(f"limit {name or '?'}: {exc}")
    names = [limit.name for limit in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    problems += [f"limit {name} is defined twice" for name in twice]
    if problems:
        # Every bad entry at once: a file is fixed in one pass, not one error a run.
        count = f"{len(problems)} bad entries: " if len(problems) > 1 else ""
        message = f"{path}: {count}" + "; ".join(problems)
        if any(problem.endswith(NOT_A_MAPPING) for problem in problems):
            raise ConfigurationError(message)  # the file's shape, not a limit's fields
        raise InvalidLimit("limits file", message)
    return found


# -- entitlements files ------------------------------------------------------------

ENTITLEMENT_FIELDS: Final = ("subject", "limit", "maximum", "effective_from")


@dataclass(frozen=True, slots=True)
class EntitlementEntry:
    """One entry of an entitlements file, validated; ``where`` names it in errors
    (``entry 3 (org-42 api_calls)``). ``effective_from`` None: when it is stored."""

    subject: str
    limit: str
    maximum: int
    effective_from: datetime | None
    where: str


def load_entitlements_file(path: str | Path) -> list[EntitlementEntry]:
    """Read per-subject maximums from a YAML or TOML file; every entry is
    validated before any is returned, and an error names the entry and field.

    The file is a list of ``{subject, limit, maximum, effective_from}``
    (``effective_from`` optional: ISO 8601, naive is UTC, a date is its
    midnight UTC), at the top level or under an ``entitlements`` key (TOML:
    ``[[entitlements]]`` tables).
    """
    path = Path(path)
    return entitlements_from_data(_read_document(path), path)


def entitlements_from_data(data: Any, path: Path | str) -> list[EntitlementEntry]:
    """`load_entitlements_file` of data already read (a JSON body): ``path`` names it."""
    if isinstance(data, Mapping) and set(data) == {"entitlements"}:
        data = data["entitlements"]
    if not isinstance(data, list):
        raise InvalidInput(
            "entitlements file", f"{path}: expected a list of entitlements (or an entitlements key)"
        )
    found: list[EntitlementEntry] = []
    seen: dict[tuple[str, str, datetime | None], str] = {}
    for number, fields in enumerate(data, start=1):
        entry = _entitlement_entry(path, number, fields)
        key = (entry.subject, entry.limit, entry.effective_from)
        if key in seen:
            raise InvalidInput(
                "entitlements file",
                f"{path}: {entry.where} repeats {seen[key]}: the same subject, limit and "
                "effective_from",
            )
        seen[key] = entry.where
        found.append(entry)
    return found


def _entitlement_entry(path: Path | str, number: int, fields: Any) -> EntitlementEntry:
    where = f"entry {number}"
    if not isinstance(fields, Mapping):
        raise InvalidInput("entitlements file", f"{path}: {where}: is not a mapping of fields")
    subject, limit = fields.get("subject"), fields.get("limit")
    if isinstance(subject, str) and isinstance(limit, str):
        where += f" (subject {shown(subject)}, limit {shown(limit)})"
    try:
        unknown = sorted(str(key) for key in fields if key not in ENTITLEMENT_FIELDS)
        if unknown:
            raise InvalidInput(unknown[0], f"unknown field; expected some of {ENTITLEMENT_FIELDS}")
        for required in ("subject", "limit", "maximum"):
            if required not in fields:
                raise InvalidInput(required, "is required")
        return EntitlementEntry(
            validate_subject(subject),
            _limit_name(limit),
            validate_amount("maximum", fields["maximum"], MAX_MAXIMUM),
            _effective_from(fields.get("effective_from")),
            where,
        )
    except InvalidInput as exc:
        raise InvalidInput("entitlements file", f"{path}: {where}: {exc}") from exc


def _limit_name(value: object) -> str:
    try:
        return validate_limit_name(value)
    except InvalidInput as exc:  # the library calls it a name; here it is the limit
        raise InvalidInput("limit", exc.message) from None


def _effective_from(value: object) -> datetime | None:
    """YAML and TOML read a bare timestamp as a datetime (a bare day as a date);
    a string is RFC 3339 (`parse_instant`). Naive means UTC."""
    if value is None:
        return None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if isinstance(value, str):
        value = parse_instant(value, field_name="effective_from")
    if not isinstance(value, datetime):
        raise InvalidInput("effective_from", f"must be an ISO-8601 time, got {shown(value)}")
    moment = as_utc(value, field_name="effective_from")
    to_us(moment, field_name="effective_from")
    return moment
