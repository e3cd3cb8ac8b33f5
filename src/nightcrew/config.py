"""Settings: the only reader of the environment.

Every variable nightcrew understands is a field here, with its default; the README's
configuration table mirrors this class (a test keeps them in step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import unquote, urlsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from nightcrew.errors import ConfigError
from nightcrew.setting_parsers import (
    IPNetwork,
    parse_allowed_hosts,
    parse_stage_prefetch,
    parse_trusted_proxies,
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        case_sensitive=True, extra="ignore", populate_by_name=True, frozen=True
    )

    # --- where things live -------------------------------------------------------------------
    database_url: Annotated[str | None, Field(alias="DATABASE_URL")] = None
    data_dir: Annotated[Path, Field(alias="NIGHTCREW_DATA_DIR")] = Path(".nightcrew")
    storage_url: Annotated[str | None, Field(alias="STORAGE_URL")] = None
    queue_url: Annotated[str, Field(alias="QUEUE_URL")] = "postgres"
    redis_url: Annotated[str | None, Field(alias="REDIS_URL")] = None

    # S3-compatible object storage credentials (the usual AWS variables).
    aws_access_key_id: Annotated[str | None, Field(alias="AWS_ACCESS_KEY_ID")] = None
    aws_secret_access_key: Annotated[SecretStr | None, Field(alias="AWS_SECRET_ACCESS_KEY")] = None
    aws_session_token: Annotated[SecretStr | None, Field(alias="AWS_SESSION_TOKEN")] = None
    aws_region: Annotated[str | None, Field(alias="AWS_REGION")] = None

    # --- the platform around us --------------------------------------------------------------
    r2_public_url: Annotated[str | None, Field(alias="R2_PUBLIC_URL")] = None
    public_feed_url: Annotated[str | None, Field(alias="PUBLIC_FEED_URL")] = None
    public_app_url: Annotated[str | None, Field(alias="PUBLIC_APP_URL")] = None

    # --- secrets (never logged; unset disables what needs them, loudly) ----------------------
    rss_invalidation_secret: Annotated[SecretStr | None, Field(alias="RSS_INVALIDATION_SECRET")] = (
        None
    )
    reconciler_secret: Annotated[SecretStr | None, Field(alias="RECONCILER_SECRET")] = None
    # required by `serve` bound beyond loopback (the dashboard's sign-in)
    dashboard_token: Annotated[SecretStr | None, Field(alias="NIGHTCREW_DASHBOARD_TOKEN")] = None
    stripe_secret_key: Annotated[SecretStr | None, Field(alias="STRIPE_SECRET_KEY")] = None
    stripe_api_base: Annotated[str | None, Field(alias="STRIPE_API_BASE")] = None
    resend_api_key: Annotated[SecretStr | None, Field(alias="RESEND_API_KEY")] = None
    resend_from_email: Annotated[str | None, Field(alias="RESEND_FROM_EMAIL")] = None
    resend_api_base: Annotated[str, Field(alias="RESEND_API_BASE")] = "https://api.resend.com"

    # --- news ingestion (spec 001) -----------------------------------------------------------
    ingestion_backpressure_queue_limit: Annotated[
        int, Field(alias="INGESTION_BACKPRESSURE_QUEUE_LIMIT", ge=0)
    ] = 250
    ingestion_backpressure_db_article_limit: Annotated[
        int, Field(alias="INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT", ge=0)
    ] = 30000
    worker_lock_ttl_seconds: Annotated[
        int, Field(alias="UPSTASH_REDIS_WORKER_LOCK_TTL_SECONDS", gt=0)
    ] = 600
    ai_review_lock_ttl_seconds: Annotated[
        int, Field(alias="UPSTASH_REDIS_AI_REVIEW_LOCK_TTL_SECONDS", gt=0)
    ] = 1800

    news_ai_base_url: Annotated[str | None, Field(alias="NEWS_AI_BASE_URL")] = None
    news_ai_api_key: Annotated[SecretStr | None, Field(alias="NEWS_AI_API_KEY")] = None
    news_ai_model: Annotated[str | None, Field(alias="NEWS_AI_MODEL")] = None
    max_ai_reviews: Annotated[int, Field(alias="MAX_AI_REVIEWS", ge=0)] = 25
    # model calls (reviews and translations) one process has in flight, whatever the engine
    news_ai_concurrency: Annotated[int, Field(alias="NEWS_AI_CONCURRENCY", ge=1, le=1024)] = 8
    # unset: no limit; shared by every process on the same Redis when REDIS_URL is set
    news_ai_requests_per_minute: Annotated[
        int | None, Field(alias="NEWS_AI_REQUESTS_PER_MINUTE", ge=1)
    ] = None
    # retries inside one model call (429, 5xx, network), honouring Retry-After
    news_ai_max_retries: Annotated[int, Field(alias="NEWS_AI_MAX_RETRIES", ge=0, le=10)] = 2
    news_shards: Annotated[str, Field(alias="NEWS_SHARDS")] = ""
    news_run_interval_minutes: Annotated[
        int, Field(alias="NEWS_RUN_INTERVAL_MINUTES", ge=1, le=60)
    ] = 10
    news_allowed_private_hosts: Annotated[str, Field(alias="NEWS_ALLOWED_PRIVATE_HOSTS")] = ""
    news_fetch_budget_seconds: Annotated[
        float, Field(alias="NEWS_FETCH_BUDGET_SECONDS", gt=0, le=600)
    ] = 30.0
    # one feed's parse, in a worker process that is killed past it (adapters/parsers.py: ParserPool)
    news_parse_budget_seconds: Annotated[
        float, Field(alias="NEWS_PARSE_BUDGET_SECONDS", gt=0, le=600)
    ] = 10.0
    # a feed's first items; the rest are dropped with a note (news/steps/parse.py)
    news_max_items_per_feed: Annotated[
        int, Field(alias="NEWS_MAX_ITEMS_PER_FEED", ge=1, le=1_000_000)
    ] = 10_000
    news_max_title_chars: Annotated[int, Field(alias="NEWS_MAX_TITLE_CHARS", ge=16)] = 1024
    news_max_summary_chars: Annotated[int, Field(alias="NEWS_MAX_SUMMARY_CHARS", ge=16)] = 16384
    # the RabbitMQ pipeline; `inline` is the one-process run of spec 001
    news_pipeline: Annotated[Literal["inline", "rabbitmq"], Field(alias="NEWS_PIPELINE")] = "inline"
    news_max_deliveries: Annotated[int, Field(alias="NEWS_MAX_DELIVERIES", ge=1, le=1000)] = 5
    news_queue_prefix: Annotated[
        str, Field(alias="NEWS_QUEUE_PREFIX", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$")
    ] = "news"
    # the pipeline's stage leases (fetch, enrich, review), renewed every third of it while the
    # work runs: a dead worker's candidates are taken over within this long
    news_stage_lease_seconds: Annotated[
        int, Field(alias="NEWS_STAGE_LEASE_SECONDS", ge=5, le=86400)
    ] = 30
    news_snapshot_debounce_seconds: Annotated[
        float, Field(alias="NEWS_SNAPSHOT_DEBOUNCE_SECONDS", gt=0, le=3600)
    ] = 5.0
    news_resend_after_seconds: Annotated[int, Field(alias="NEWS_RESEND_AFTER_SECONDS", ge=60)] = (
        3600
    )
    # per-stage prefetch of `news worker`, "fetch=8,review=2"; unnamed stages: --concurrency
    news_stage_prefetch: Annotated[str, Field(alias="NEWS_STAGE_PREFETCH")] = ""

    # the storage reconciler's listing: partitions listed at once (unset: 16 on S3, the core
    # count on local disk)
    reconcile_list_concurrency: Annotated[
        int | None, Field(alias="RECONCILE_LIST_CONCURRENCY", ge=1, le=256)
    ] = None

    # the overage scan: slices of the accounts scanned at once, each on a pooled connection (the
    # platform's per-account effective_cap() cannot run in a parallel query)
    overage_scan_slices: Annotated[
        int, Field(alias="NIGHTCREW_OVERAGE_SCAN_SLICES", ge=1, le=64)
    ] = 2

    # --- nightcrew's own knobs ---------------------------------------------------------------
    # reverse proxies whose X-Forwarded-For / X-Forwarded-Proto `serve` believes (addresses and
    # CIDRs, web/proxies.py); empty: nobody's
    trusted_proxies: Annotated[str, Field(alias="NIGHTCREW_TRUSTED_PROXIES")] = ""
    # `serve`: a request must arrive whole within this long of its first byte; at most this
    # many connections, the slowest closed first (web/connections.py)
    http_read_timeout_seconds: Annotated[
        float, Field(alias="NIGHTCREW_HTTP_READ_TIMEOUT_SECONDS", gt=0, le=300)
    ] = 10.0
    http_max_connections: Annotated[
        int, Field(alias="NIGHTCREW_HTTP_MAX_CONNECTIONS", ge=16, le=100_000)
    ] = 1000
    db_connect_timeout_seconds: Annotated[
        float, Field(alias="NIGHTCREW_DB_CONNECT_TIMEOUT_SECONDS", gt=0)
    ] = 5.0
    db_pool_max_size: Annotated[int, Field(alias="NIGHTCREW_DB_POOL_MAX_SIZE", ge=2)] = 10
    db_pool_timeout_seconds: Annotated[
        float, Field(alias="NIGHTCREW_DB_POOL_TIMEOUT_SECONDS", gt=0)
    ] = 10.0
    db_statement_timeout_seconds: Annotated[
        float, Field(alias="NIGHTCREW_DB_STATEMENT_TIMEOUT_SECONDS", ge=0)
    ] = 120.0
    db_long_statement_timeout_seconds: Annotated[
        float, Field(alias="NIGHTCREW_DB_LONG_STATEMENT_TIMEOUT_SECONDS", ge=0)
    ] = 3600.0
    db_idle_in_transaction_timeout_seconds: Annotated[
        float, Field(alias="NIGHTCREW_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", ge=0)
    ] = 60.0
    db_keepalives_idle_seconds: Annotated[
        int, Field(alias="NIGHTCREW_DB_KEEPALIVES_IDLE_SECONDS", ge=1)
    ] = 10
    # Linux caps TCP_KEEPINTVL at 32767 s and TCP_KEEPCNT at 127 (setsockopt refuses more)
    db_keepalives_interval_seconds: Annotated[
        int, Field(alias="NIGHTCREW_DB_KEEPALIVES_INTERVAL_SECONDS", ge=1, le=32767)
    ] = 5
    db_keepalives_count: Annotated[
        int, Field(alias="NIGHTCREW_DB_KEEPALIVES_COUNT", ge=1, le=127)
    ] = 3
    # the minute lane's statements are short: its bound on a silent server (0: the pool's)
    db_minute_statement_timeout_seconds: Annotated[
        float, Field(alias="NIGHTCREW_DB_MINUTE_STATEMENT_TIMEOUT_SECONDS", ge=0)
    ] = 10.0
    db_tcp_user_timeout_seconds: Annotated[
        float, Field(alias="NIGHTCREW_DB_TCP_USER_TIMEOUT_SECONDS", ge=0)
    ] = 15.0
    log_level: Annotated[
        Literal["debug", "info", "warning", "error"], Field(alias="NIGHTCREW_LOG_LEVEL")
    ] = "info"

    @field_validator("queue_url")
    @classmethod
    def _known_queue_backend(cls, value: str) -> str:
        if value == "postgres" or urlsplit(value).scheme in ("amqp", "amqps"):
            return value
        raise ValueError(f"unknown queue backend {value!r}; expected 'postgres' or amqp://…")

    @model_validator(mode="after")
    def _pipeline_needs_rabbitmq(self) -> Settings:
        if self.news_pipeline == "rabbitmq" and not self.queue_url.startswith("amqp"):
            raise ValueError("NEWS_PIPELINE=rabbitmq needs QUEUE_URL=amqp://… (the stage queues)")
        return self

    @field_validator("news_allowed_private_hosts")
    @classmethod
    def _allowed_hosts(cls, value: str) -> str:
        parse_allowed_hosts(value)  # a ValueError names the entry it cannot read
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _trusted_proxies(cls, value: str) -> str:
        parse_trusted_proxies(value)  # a ValueError names the entry it cannot read
        return value

    @field_validator("news_stage_prefetch")
    @classmethod
    def _stage_prefetch(cls, value: str) -> str:
        parse_stage_prefetch(value)  # a ValueError names the entry it cannot read
        return value

    @field_validator(
        "news_ai_base_url",
        "public_feed_url",
        "public_app_url",
        "r2_public_url",
        "stripe_api_base",
        "resend_api_base",
        mode="after",
    )
    @classmethod
    def _http_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or value.strip() == "":
            return None
        parts = urlsplit(value.strip())
        try:
            host = parts.hostname
            parts.port  # noqa: B018 - a port that is not a number raises here
        except ValueError:
            host = None
        if parts.scheme not in ("http", "https") or not host or any(c.isspace() for c in value):
            raise ValueError("must be an http(s)://host… URL")
        if info.field_name == "news_ai_base_url" and (parts.username or parts.password):
            # the SDK would send it as the key in place of NEWS_AI_API_KEY, and say nothing
            raise ValueError("must not carry a user or password; put the key in NEWS_AI_API_KEY")
        return value.strip()

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        try:
            parts.port  # noqa: B018 - a port that is not a number raises here
        except ValueError as exc:
            raise ValueError(f"must be a redis://host:port URL ({exc})") from None
        return value.strip()

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        scheme = urlsplit(value).scheme
        if scheme not in ("postgres", "postgresql"):
            raise ValueError("must be a postgresql://… URL")
        return value

    @property
    def news_shard_list(self) -> list[str]:
        return [s.strip() for s in self.news_shards.split(",") if s.strip()]

    @property
    def trusted_proxy_networks(self) -> tuple[IPNetwork, ...]:
        return parse_trusted_proxies(self.trusted_proxies)

    @property
    def embedded_pgdata(self) -> Path:
        return self.data_dir / "pg"

    @property
    def effective_storage_url(self) -> str:
        return self.storage_url or f"file://{(self.data_dir / 'media').resolve()}"

    def storage_credentials(self) -> dict[str, str]:
        """What the S3 client needs, read here so nothing else touches the environment."""
        creds = {
            "access_key_id": self.aws_access_key_id,
            "secret_access_key": reveal(self.aws_secret_access_key),
            "session_token": reveal(self.aws_session_token),
            "region": self.aws_region,
        }
        return {k: v for k, v in creds.items() if v}

    def secret_values(self) -> list[str]:
        """Every configured secret, so the log pipeline can scrub them wherever they appear."""
        secrets = [
            self.rss_invalidation_secret,
            self.reconciler_secret,
            self.dashboard_token,
            self.stripe_secret_key,
            self.resend_api_key,
            self.aws_secret_access_key,
            self.aws_session_token,
            self.news_ai_api_key,
        ]
        values = [s.get_secret_value() for s in secrets if s is not None and s.get_secret_value()]
        # the passwords inside the service URLs; a driver's error may quote one without its URL
        for url in (self.database_url, self.redis_url, self.queue_url, self.news_ai_base_url):
            values.extend(_url_passwords(url))
        return values


def _url_passwords(url: str | None) -> list[str]:
    """The password of ``scheme://[user]:password@host`` (``redis://:pw@host`` too), as
    written and percent-decoded: an error message may quote either."""
    if not url:
        return []
    try:
        password = urlsplit(url).password
    except ValueError:
        return []
    return sorted({password, unquote(password)}) if password else []


def reveal(secret: SecretStr | None) -> str | None:
    """A secret's value where it must be used (a client's key); None when unset."""
    return secret.get_secret_value() if secret is not None else None


def load_settings() -> Settings:
    """Read the environment once; a bad value becomes one line naming the variable."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            # pydantic prefixes a validator's own message with its error class ("Value error,
            # …"): noise to a person reading which variable is wrong and why
            message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
            name = ".".join(str(part) for part in error["loc"])
            # a check across variables (a model validator) has no location: its message names
            # the variables itself
            problems.append(f"{name}: {message}" if name else message)
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
