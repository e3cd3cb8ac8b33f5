"""Which Redis and RabbitMQ the tests use is explicit: their own variables, never nightcrew's."""

from __future__ import annotations

from tests.support.servers import free_port
from tests.support.services import (
    AMQP_VARIABLE,
    REDIS_VARIABLE,
    configured,
    skip_reason,
    with_port,
)


def test_the_defaults_are_the_local_servers_and_nightcrews_own_variables_are_ignored() -> None:
    environ = {"REDIS_URL": "redis://prod:6379/0", "QUEUE_URL": "amqp://u:p@prod:5672/"}
    assert configured(REDIS_VARIABLE, environ) == "redis://127.0.0.1:6379/15"
    assert configured(AMQP_VARIABLE, environ) == "amqp://guest:guest@127.0.0.1:5672/"
    assert configured(REDIS_VARIABLE, {REDIS_VARIABLE: "redis://r:1/2"}) == "redis://r:1/2"


def test_empty_or_off_turns_a_server_off_and_its_tests_say_why_they_skip() -> None:
    for value in ("", "off", " OFF "):
        assert configured(AMQP_VARIABLE, {AMQP_VARIABLE: value}) is None
    assert skip_reason(AMQP_VARIABLE, None) == "NIGHTCREW_TEST_AMQP_URL is off"


def test_a_server_that_does_not_answer_is_a_skip_naming_where_it_looked() -> None:
    port = free_port()
    reason = skip_reason(REDIS_VARIABLE, f"redis://127.0.0.1:{port}/0")
    assert reason is not None
    assert f"nothing answers at 127.0.0.1:{port}" in reason and REDIS_VARIABLE in reason


def test_a_proxy_in_front_keeps_credentials_and_vhost() -> None:
    assert with_port("amqp://guest:pw@10.0.0.5:5672/v", 4000) == "amqp://guest:pw@127.0.0.1:4000/v"
    assert with_port("redis://127.0.0.1:6379/15", 4001) == "redis://127.0.0.1:4001/15"
