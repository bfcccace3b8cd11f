"""`Meter`'s methods for what a subject used: its usage now, usage history and the
usage page's links, handed to `metering.usage.current`, `metering.usage.history` and
`metering.usage.portal` (a part of the facade, kept beside its feature)."""

from __future__ import annotations

from datetime import datetime

from metering.storage.database import Database
from metering.usage import current, history, portal
from metering.usage.current import LimitUsage
from metering.usage.history import UsageHistory


class UsageFacade:
    """Usage now, usage history and portal links of a `metering.Meter`."""

    database: Database

    def usage(self, subject: str) -> list[LimitUsage]:
        """A subject's limits now: used, remaining, grants left, when they run out."""
        return current.subject_usage(self.database, subject)

    def usage_history(
        self,
        subject: str,
        limit: str,
        since: datetime | None = None,
        until: datetime | None = None,
        bucket: str = "day",
    ) -> UsageHistory:
        """``subject``'s use of ``limit`` per hour or day, with the maximum in force."""
        return history.usage_history(
            self.database, subject, limit, since=since, until=until, bucket=bucket
        )

    def portal_link(
        self, subject: str, ttl_seconds: int = 3600, base_url: str | None = None
    ) -> str:
        """A signed link to ``subject``'s usage page (GET /portal) for ``ttl_seconds``,
        under ``base_url``, else ``METERING_PUBLIC_URL``, else http://127.0.0.1:8000."""
        return portal.make_link(self.database, subject, ttl_seconds, base_url)

    def rotate_portal_secret(self, grace_seconds: int = 86400) -> datetime:
        """Sign portal links with a new secret; older links work until the time returned."""
        return portal.rotate_link_secret(self.database, grace_seconds)
