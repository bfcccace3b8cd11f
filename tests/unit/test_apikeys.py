"""API keys: the service's rules and the settings of the API's keys
(``metering apikeys``: tests/cli/test_cli_apikeys.py).

The HTTP side (401, 403, 429, revocation, the table's contents on
PostgreSQL too) is in tests/api/test_api_auth.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Meter
from metering.apikeys import ApiKeys, key_id_of
from metering.errors import ConfigurationError, InvalidInput, UnknownApiKey
from metering.settings import DEFAULT_API_RATE, ApiRate, Settings, api_rate, auth_mode, parse_rate

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite database (a copy of the session's template)."""
    return sqlite_url


@pytest.fixture
def meter(url: str) -> Meter:
    return Meter(url, clock=FrozenClock(NOW))


def test_authenticate_knows_the_token_and_nothing_like_it(meter: Meter) -> None:
    keys = ApiKeys(meter)
    key, token = keys.create("read", name=" reports ")
    assert key.name == "reports" and key.created_at == NOW
    found = keys.authenticate(token)
    assert found is not None and found.id == key.id and found.allows("read")
    secret = token[16:]
    flipped = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    other_id = "mk_" + ("0" * 12 if key.id != "mk_" + "0" * 12 else "1" * 12)
    for wrong in (
        "",
        token[:-1],
        token + "x",
        f"{key.id}_{flipped}",  # the right id, another secret
        f"{other_id}_{secret}",  # the right secret, another id
        token.upper(),
        " " + token,
    ):
        assert keys.authenticate(wrong) is None, wrong
    meter.close()


def test_scopes_admin_includes_ingest_and_read(meter: Meter) -> None:
    keys = ApiKeys(meter)
    grants = {}
    for scope in ("ingest", "read", "admin"):
        key, _token = keys.create(scope)
        grants[scope] = {s for s in ("ingest", "read", "admin") if key.allows(s)}
    assert grants == {
        "ingest": {"ingest"},
        "read": {"read"},
        "admin": {"ingest", "read", "admin"},
    }
    with pytest.raises(InvalidInput, match="scope: must be one of ingest, read, admin"):
        keys.create("owner")
    meter.close()


def test_last_use_is_written_at_most_once_a_minute(meter: Meter, url: str) -> None:
    keys = ApiKeys(meter)
    key, token = keys.create("ingest")
    assert keys.get(key.id).last_used_at is None
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    keys.authenticate(token)
    assert keys.get(key.id).last_used_at == NOW
    clock.advance(seconds=59)
    keys.authenticate(token)
    assert keys.get(key.id).last_used_at == NOW  # no write within the minute
    clock.advance(seconds=1)
    keys.authenticate(token)
    assert keys.get(key.id).last_used_at == NOW + timedelta(seconds=60)
    meter.close()


def test_a_revoked_key_no_longer_authenticates(meter: Meter) -> None:
    keys = ApiKeys(meter)
    key, token = keys.create("admin")
    assert keys.revoke(key.id) is True
    assert keys.authenticate(token) is None
    assert keys.revoke(key.id) is False
    assert keys.get(key.id).revoked_at == NOW
    assert not keys.get(key.id).allows("read")
    assert keys.any_exist()
    with pytest.raises(UnknownApiKey):
        keys.revoke("mk_ffffffffffff")
    with pytest.raises(InvalidInput):
        key_id_of("mk_")
    meter.close()


# -- settings ---------------------------------------------------------------------


def test_the_api_settings_and_their_defaults() -> None:
    assert Settings.from_env({}).api_auth == "auto"
    assert Settings.from_env({}).api_rate == DEFAULT_API_RATE == ApiRate(6000, "1m")
    assert auth_mode({"METERING_API_AUTH": " Required "}) == "required"
    assert api_rate({"METERING_API_RATE": "off"}) is None
    assert parse_rate("600/1m") == ApiRate(600, "1m")
    assert parse_rate("120/60s") == ApiRate(120, "1m")
    assert parse_rate(" 10 / 1s ") == ApiRate(10, "1s")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"METERING_API_AUTH": "off"}, "METERING_API_AUTH must be auto or required"),
        ({"METERING_API_RATE": "600"}, "METERING_API_RATE must be N/PERIOD"),
        ({"METERING_API_RATE": "x/1m"}, "METERING_API_RATE must be N/PERIOD"),
        ({"METERING_API_RATE": "-1/1m"}, "METERING_API_RATE must be N/PERIOD"),
        ({"METERING_API_RATE": "0/1m"}, "N must be from 1"),
        ({"METERING_API_RATE": "5/1mo"}, "the period must be in s, m, h, d or w"),
        ({"METERING_API_RATE": "5/soon"}, "is not a period"),
        ({"METERING_API_RATE": "9" * 40 + "/1m"}, "METERING_API_RATE must be N/PERIOD"),
    ],
)
def test_bad_api_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env(env)
