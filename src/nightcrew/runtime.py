"""The Runtime: every adapter, opened once and closed once.

Doors (CLI, HTTP, scheduler) build a Runtime from Settings and hand it to jobs; jobs never read
the environment or construct a driver themselves. ``dry_run_view()`` swaps every adapter that
could change something for one that only reads or records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import httpx

from nightcrew.adapters.billing import Billing, DryRunBilling, NoBilling, StripeBilling
from nightcrew.adapters.feedcache import FeedCache, HttpFeedCache, RecordingFeedCache
from nightcrew.adapters.mail import Mailer, RecordingMailer, ResendMailer
from nightcrew.adapters.news import NewsAdapters, open_news_adapters
from nightcrew.adapters.queues import (
    MemoryQueueProducer,
    PostgresQueueProducer,
    QueueProducer,
    RabbitQueueProducer,
)
from nightcrew.adapters.storage import ObjectStore, ReadOnlyStore, open_store
from nightcrew.adapters.tls import tls_context
from nightcrew.clock import Clock
from nightcrew.config import Settings, reveal
from nightcrew.db.connection import ConnectionPolicy
from nightcrew.db.database import Database
from nightcrew.db.embedded import EmbeddedPostgres
from nightcrew.errors import ConfigError
from nightcrew.metrics import Metrics

if TYPE_CHECKING:  # effects/deliver.py imports this module
    from nightcrew.effects.deliver import EffectHandler

USER_AGENT = "nightcrew"


@dataclass(frozen=True, kw_only=True, slots=True)
class Runtime:
    settings: Settings
    db: Database
    queues: QueueProducer
    store: ObjectStore
    feedcache: FeedCache
    billing: Billing
    mail: Mailer = field(default_factory=RecordingMailer)
    news: NewsAdapters | None = None  # the news worker's leases, HTTP client, Redis, reviewer
    metrics: Metrics = field(default_factory=Metrics)
    dry_run: bool = False
    # the domains' effect kinds beside the built-in ones (effects/deliver.py), by kind
    effect_handlers: Mapping[str, EffectHandler] = field(default_factory=dict)

    def news_adapters(self) -> NewsAdapters:
        if self.news is None:
            raise ConfigError("this runtime was assembled without the news worker's adapters")
        return self.news

    def dry_run_view(self, clock: Clock) -> Runtime:
        """The same runtime, except that nothing it does can change anything anywhere."""
        return replace(
            self,
            db=self.db.rollback_only(),
            queues=MemoryQueueProducer(clock),
            store=ReadOnlyStore(self.store),
            feedcache=RecordingFeedCache(),
            billing=DryRunBilling(configured=self.billing.configured),
            mail=RecordingMailer(configured=self.mail.configured),
            dry_run=True,
        )


@contextmanager
def embedded_database(
    settings: Settings, name: str | None = None, *, fresh: bool = False
) -> Iterator[str | None]:
    """The embedded PostgreSQL of NIGHTCREW_DATA_DIR, running while inside (stopped after, when
    no other nightcrew process uses it): the URL of its default database, or of its database
    ``name`` — made anew when ``fresh``, None when there is none (the demo's)."""
    embedded = EmbeddedPostgres.start(settings.embedded_pgdata)
    try:
        yield embedded.uri if name is None else embedded.database(name, fresh=fresh)
    finally:
        embedded.stop()


@asynccontextmanager
async def open_database(settings: Settings) -> AsyncIterator[Database]:
    """The pool against DATABASE_URL, or against the embedded server when it is unset."""
    with ExitStack() as stack:
        conninfo = settings.database_url or stack.enter_context(embedded_database(settings))
        assert conninfo is not None  # the embedded server's default database always exists
        db = await Database.open(conninfo, policy=connection_policy(settings))
        try:
            yield db
        finally:
            await db.close()


def connection_policy(settings: Settings) -> ConnectionPolicy:
    return ConnectionPolicy(
        connect_timeout=settings.db_connect_timeout_seconds,
        pool_timeout=settings.db_pool_timeout_seconds,
        max_size=settings.db_pool_max_size,
        keepalives_idle=settings.db_keepalives_idle_seconds,
        keepalives_interval=settings.db_keepalives_interval_seconds,
        keepalives_count=settings.db_keepalives_count,
        tcp_user_timeout=settings.db_tcp_user_timeout_seconds,
        statement_timeout=settings.db_statement_timeout_seconds,
        idle_in_transaction_timeout=settings.db_idle_in_transaction_timeout_seconds,
        secrets=tuple(settings.secret_values()),
    )


def _billing(settings: Settings) -> StripeBilling | NoBilling:
    key = reveal(settings.stripe_secret_key)
    if key is None:
        return NoBilling()
    return StripeBilling(key, api_base=settings.stripe_api_base)


@asynccontextmanager
async def _database(settings: Settings, given: Database | None) -> AsyncIterator[Database]:
    if given is not None:
        yield given
        return
    async with open_database(settings) as db:
        yield db


@asynccontextmanager
async def assemble(
    settings: Settings,
    clock: Clock,
    *,
    effect_handlers: Mapping[str, EffectHandler],
    **overrides: Any,
) -> AsyncIterator[Runtime]:
    """Every adapter, from Settings, and the domains' effect handlers; ``assembly.open_runtime``
    is what the doors call. ``overrides`` replace single adapters by field name (a test's
    recording mailer, a benchmark's memory store); ``db=`` an open Database is used as it is,
    not opened (nor closed) here; ``reviewer=`` replaces the news worker's configured reviewer
    (the demo's offline rules) and leaves the rest of its adapters as configured."""
    store = open_store(settings.effective_storage_url, credentials=settings.storage_credentials())
    async with (
        _database(settings, overrides.pop("db", None)) as db,
        httpx.AsyncClient(
            timeout=httpx.Timeout(10.0, connect=5.0),
            headers={"User-Agent": USER_AGENT},
            follow_redirects=False,
            verify=tls_context(trust_env=True),
        ) as http,
        open_news_adapters(settings, db, clock, reviewer=overrides.pop("reviewer", None)) as news,
    ):
        billing = _billing(settings)
        secret = settings.rss_invalidation_secret
        queues: QueueProducer
        rabbit: RabbitQueueProducer | None = None
        if "queues" in overrides or settings.queue_url == "postgres":
            queues = PostgresQueueProducer(db, clock)
        else:
            queues = rabbit = await RabbitQueueProducer.connect(settings.queue_url)
        try:
            runtime = Runtime(
                settings=settings,
                db=db,
                queues=queues,
                store=store,
                feedcache=HttpFeedCache(http, settings.public_feed_url, reveal(secret)),
                billing=billing,
                mail=ResendMailer(
                    http,
                    api_base=settings.resend_api_base,
                    api_key=reveal(settings.resend_api_key),
                    from_email=settings.resend_from_email,
                ),
                news=news,
                effect_handlers=effect_handlers,
            )
            yield replace(runtime, **overrides)
        finally:
            if isinstance(billing, StripeBilling):
                await billing.close()
            if rabbit is not None:
                await rabbit.close()
