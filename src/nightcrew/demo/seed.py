"""The demo's sample podcast platform: who and what is in it, each row named for the story.

The rows are written by the statements of ``seed.sql`` (each names every column it sets), the
audio files into the demo's store; ``Sample`` remembers a human name for every id, so the
lanes' reports can be told in words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from nightcrew.adapters.storage import ObjectStore
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries

SQL = load_queries(__file__)

DEMO_MEDIA_URL = "https://media.demo.nightcrew.test"
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)


@dataclass(kw_only=True)
class Sample:
    """What was seeded, by name, so the outcome can be told in words."""

    names: dict[str, str] = field(default_factory=dict)  # id → human name
    files: int = 0
    bytes: int = 0
    orphan_key: str = ""

    def name(self, row_id: object) -> str:
        return self.names.get(str(row_id), str(row_id)[:8])


@dataclass(frozen=True, kw_only=True, slots=True)
class Podcast:
    """A podcast's columns the demo sets (the rest: the reference schema's defaults)."""

    status: str = "active"
    hosting_type: str = "podcasterplus"
    paused_at: datetime | None = None
    pause_expires_at: datetime | None = None
    deletion_scheduled_at: datetime | None = None
    deletion_redirect_url: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Episode:
    published_at: datetime
    files: int = 1  # audio files in its folder; the first is its enclosure
    external_link_status: str | None = None
    external_link_attempt: int = 0
    external_link_next_attempt_at: datetime | None = None


class _Seeder:
    """Rows of a small podcast platform, each named in ``sample`` for the story."""

    def __init__(self, db: Database, store: ObjectStore, now: datetime) -> None:
        self.db, self.store, self.now = db, store, now
        self.sample = Sample()

    def ago(self, delta: timedelta) -> datetime:
        return self.now - delta

    async def insert(self, statement: str, params: Mapping[str, object], name: str) -> str:
        inserted = await self.db.fetch_value(object, SQL[statement], params)
        assert inserted is not None  # every seeding INSERT returns its id
        self.sample.names[str(inserted)] = name
        return str(inserted)

    async def user(
        self,
        email: str,
        created: datetime,
        *,
        confirmed: datetime | None = None,
        invited: datetime | None = None,
    ) -> str:
        return await self.insert(
            "user",
            {
                "email": email,
                "created_at": created,
                "email_confirmed_at": confirmed,
                "invited_at": invited,
            },
            email,
        )

    async def account(self, owner: str, name: str, model: str) -> str:
        params = {
            "owner": owner,
            "billing_model": model,
            "plan": "creator",
            "stripe_customer_id": f"cus_{name.lower()}",
        }
        acct = await self.insert("account", params, name)
        email = self.sample.names[owner]
        await self.db.execute(SQL["profile"], {"user_id": owner, "email": email, "account": acct})
        return acct

    async def podcast(
        self, title: str, acct: str, owner: str, podcast: Podcast | None = None
    ) -> str:
        columns = podcast or Podcast()
        pid = await self.insert(
            "podcast",
            {
                "slug": title.lower().replace(" ", "-"),
                "title": title,
                "account": acct,
                "status": columns.status,
                "hosting_type": columns.hosting_type,
                "paused_at": columns.paused_at,
                "pause_expires_at": columns.pause_expires_at,
                "deletion_scheduled_at": columns.deletion_scheduled_at,
                "deletion_redirect_url": columns.deletion_redirect_url,
            },
            f"“{title}”",
        )
        await self.db.execute(SQL["owner"], {"podcast": pid, "user_id": owner})
        return pid

    async def episode(self, pid: str, title: str, episode: Episode) -> str:
        eid = await self.insert(
            "episode",
            {
                "podcast": pid,
                "title": title,
                "published_at": episode.published_at,
                "external_link_status": episode.external_link_status,
                "external_link_attempt": episode.external_link_attempt,
                "external_link_next_attempt_at": episode.external_link_next_attempt_at,
            },
            f"“{title}”",
        )
        for n in range(episode.files):
            data = f"sample audio {title} #{n}\n".encode() * 64
            key = f"podcasts/{pid}/e/{eid}/audio-{n}.mp3"
            await self.store.put(key, data)
            self.sample.files += 1
            self.sample.bytes += len(data)
            if n == 0:
                await self.db.execute(
                    SQL["enclosure"], {"audio_url": f"{DEMO_MEDIA_URL}/{key}", "episode": eid}
                )
        return eid

    async def podcast_import(
        self, pid: str, name: str, status: str, at: datetime, *, migration: bool = False
    ) -> str:
        """An import created at ``at``; a running one was started and dispatched then too."""
        started = at if status == "running" else None
        return await self.insert(
            "podcast_import",
            {
                "podcast": pid,
                "status": status,
                "migration": migration,
                "started_at": started,
                "created_at": at,
            },
            name,
        )


async def seed(db: Database, store: ObjectStore, now: datetime) -> Sample:
    seeder = _Seeder(db, store, now)
    ago = seeder.ago
    ada = await seeder.user("ada@example.test", ago(400 * DAY), confirmed=ago(400 * DAY))
    bo = await seeder.user("bo@example.test", ago(300 * DAY), confirmed=ago(300 * DAY))
    await seeder.user("signup-bot@example.test", ago(9 * DAY))
    await seeder.user("new-listener@example.test", ago(2 * DAY))
    await seeder.user("invited-cohost@example.test", ago(30 * DAY), invited=ago(30 * DAY))
    # The "creator" plan serves two podcasts; Acme runs three, so its 30-day clock will start.
    await db.execute(
        SQL["plan_limit"],
        {"plan": "creator", "resource": "podcasts_per_account", "limit_value": 2},
    )
    acme = await seeder.account(ada, "Acme", "subscription")
    corp = await seeder.account(bo, "Corp", "enterprise_manual")

    brew = await seeder.podcast("Morning Brew", acme, ada)
    brew_episodes = [
        await seeder.episode(brew, f"Brew #{n + 1}", Episode(published_at=ago((3 - n) * 7 * DAY)))
        for n in range(3)
    ]
    owls = await seeder.podcast(
        "Night Owls",
        acme,
        ada,
        Podcast(status="paused", paused_at=ago(90 * DAY), pause_expires_at=ago(DAY)),
    )
    await seeder.episode(owls, "Owls pilot", Episode(published_at=ago(120 * DAY)))
    garden = await seeder.podcast(
        "Garden Hour",
        corp,
        bo,
        Podcast(status="paused", paused_at=ago(10 * DAY), pause_expires_at=now + 7 * DAY),
    )
    await seeder.episode(garden, "Seeds", Episode(published_at=ago(30 * DAY)))
    old = await seeder.podcast(
        "Old Times",
        corp,
        bo,
        Podcast(
            status="pending_deletion",
            deletion_scheduled_at=ago(DAY),
            deletion_redirect_url="https://example.test/moved",
        ),
    )
    for n in range(3):
        await seeder.episode(
            old,
            f"Old Times {n + 1}",
            Episode(published_at=ago(200 * DAY), files=2 if n == 0 else 1),
        )
    await seeder.podcast(
        "Second Thoughts",
        corp,
        bo,
        Podcast(status="pending_deletion", deletion_scheduled_at=now + 10 * DAY),
    )
    ext = await seeder.podcast("Elsewhere FM", acme, ada, Podcast(hosting_type="external"))
    # A trailer uploaded and abandoned three days ago: no episode points at it any more.
    seeder.sample.orphan_key = f"podcasts/{ext}/e/retired-take/take-1.mp3"
    await store.put(seeder.sample.orphan_key, b"an old take\n" * 256)
    seeder.sample.files += 1
    await seeder.episode(
        ext,
        "Hosted elsewhere",
        Episode(
            published_at=ago(DAY),
            files=0,
            external_link_status="pending",
            external_link_attempt=1,
            external_link_next_attempt_at=ago(10 * MINUTE),
        ),
    )

    imp = await seeder.podcast_import(
        brew, "the import into “Morning Brew”", "running", ago(30 * MINUTE)
    )
    for status, attempts, age in (
        ("pending", 1, 5 * MINUTE),
        ("processing", 0, 20 * MINUTE),
        ("completed", 1, 25 * MINUTE),
        ("pending", 0, 10 * 1e-3 * MINUTE),
    ):
        await db.execute(
            SQL["import_item"],
            {"import_id": imp, "status": status, "attempts": attempts, "at": ago(age)},
        )
    await seeder.podcast_import(
        ext,
        "the hosting-migration preview of “Elsewhere FM”",
        "preview",
        ago(20 * MINUTE),
        migration=True,
    )
    await seeder.insert(
        "media_job",
        {"episode": brew_episodes[0], "type": "normalize", "at": ago(4 * 60 * MINUTE)},
        "a loudness-normalisation job on “Brew #1”",
    )
    return seeder.sample
