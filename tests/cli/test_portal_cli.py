"""``metering portal link|rotate`` (`cli/portal.py`) on a SQLite file: the link
alone on stdout, signed for the subject until its time to live ends; a
rotation keeps older links working through its grace; bad durations are one
``error:`` line."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from click.testing import CliRunner

from metering import Meter
from metering.cli import main
from metering.domain.links import verify
from metering.storage.history import portal_secrets


def _run(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--database", url, "portal", *args])
    return result.exit_code, result.output


def _subject_of(url: str, link: str, now_s: int) -> list[str | None]:
    token = parse_qs(urlsplit(link).query)["token"][0]
    with Meter(url) as meter:
        secrets = meter.database.run(lambda c: portal_secrets(c, now_s * 1_000_000))
    return [verify(secret, token, now_s) for secret in secrets]


def test_a_link_is_printed_alone_and_signed_for_its_subject(sqlite_url: str) -> None:
    url = sqlite_url
    code, output = _run(url, "link", "org-1", "--ttl", "30m", "--base-url", "https://usage.test")
    assert code == 0 and output.count("\n") == 1
    link = output.strip()
    assert link.startswith("https://usage.test/portal?")
    token = parse_qs(urlsplit(link).query)["token"][0]
    expires = int(token.split(".")[2])
    assert _subject_of(url, link, expires - 1) == ["org-1"]
    assert _subject_of(url, link, expires) == [None]


def test_a_rotation_keeps_older_links_through_its_grace(sqlite_url: str) -> None:
    url = sqlite_url
    _, before = _run(url, "link", "org-1")
    code, output = _run(url, "rotate", "--grace", "30m")
    assert code == 0 and output.startswith("rotated: links made before now work until ")
    token = parse_qs(urlsplit(before.strip()).query)["token"][0]
    now_s = int(token.split(".")[2]) - 3600  # the link was made for 1 h
    assert _subject_of(url, before.strip(), now_s) == [None, "org-1"]


def test_a_bad_duration_is_one_error_line(sqlite_url: str) -> None:
    url = sqlite_url
    for args in (["link", "org-1", "--ttl", "1y"], ["rotate", "--grace", "40d"]):
        code, output = _run(url, *args)
        assert code == 1 and output.startswith("error:") and output.count("\n") == 1
