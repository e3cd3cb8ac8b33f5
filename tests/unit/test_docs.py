"""The docs cannot rot: what the code has, the reference names (docs/, mkdocs.yml).

Every command and option of the Typer app, every path of the OpenAPI document and every route
of the dashboard, every metric, every log event (and a run-book entry for each one logged at
warning or error), every field of the news report, every page in the site's navigation; the
README stays a front page and no page reads like a lab notebook. The settings table is checked
by tests/unit/test_config.py; what needs a database (the data model, the lanes' reports) and the
tutorial's commands by tests/acceptance/test_docs_*.py.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "nightcrew"
README = ROOT / "README.md"

# The README's two commands, byte for byte (.ci/run runs the second verbatim).
RUN_IT = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/nightcrew demo"
TEST_IT = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest"
)
README_MAX_LINES = 250


def page(relative: str) -> str:
    return (DOCS / relative).read_text(encoding="utf-8")


def named(text: str, name: str) -> bool:
    """``name`` appears in ``text`` as code: `name`, or `name …` / `… name` inside a span."""
    code = r"`[^`\n]*(?<![\w.-])" + re.escape(name) + r"(?![\w-])[^`\n]*`"
    return re.search(code, text) is not None


# --- the README ----------------------------------------------------------------------------------
def test_the_readme_is_a_front_page_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    fenced = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert f"{RUN_IT}\n" in fenced and f"{TEST_IT}\n" in fenced
    assert "docs/dashboard.png" in text
    for target in re.findall(r"\]\(((?:docs/)[^)#]+)", text):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


# --- the command line ----------------------------------------------------------------------------
def _commands() -> Iterator[tuple[str, Any]]:
    """(``nightcrew db migrate``, its click command) for every command of the Typer app."""
    import typer.main

    from nightcrew.cli import app

    def walk(command: Any, path: str) -> Iterator[tuple[str, Any]]:
        if getattr(command, "hidden", False):
            return
        yield path, command
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(sub, f"{path} {name}")

    yield from walk(typer.main.get_command(app), "nightcrew")


def _sections(text: str) -> dict[str, str]:
    """A page's ``## `…` `` sections, by the code in their heading."""
    sections: dict[str, str] = {}
    parts = re.split(r"^## ", text, flags=re.M)
    for part in parts[1:]:
        heading, _, body = part.partition("\n")
        for code in re.findall(r"`([^`]+)`", heading):
            sections[code] = body
    return sections


def test_every_command_and_option_is_in_the_cli_reference() -> None:
    text = page("reference/cli.md")
    sections = _sections(text)
    synopsis = text.split("\n## ", 1)[0]
    missing = []
    for path, command in _commands():
        options = [
            name
            for param in command.params
            if getattr(param, "param_type_name", "") == "option" and not param.hidden
            for name in (*param.opts, *param.secondary_opts)
            if name.startswith("--")
        ]
        if getattr(command, "commands", None) and not options:
            continue  # a group: its commands have their own sections
        if path not in sections:
            missing.append(f"a section `{path}`")
            continue
        missing += [f"{path} {o}" for o in options if not named(sections[path], o)]
        if not re.search(rf"^{re.escape(path)}(?:\s|$)", synopsis, re.M):
            missing.append(f"{path} in the synopsis")
    assert missing == [], "docs/reference/cli.md lacks: " + ", ".join(missing)


# --- HTTP ----------------------------------------------------------------------------------------
async def test_every_openapi_path_and_dashboard_route_is_in_the_http_reference() -> None:
    import httpx

    from nightcrew.http import create_app
    from nightcrew.metrics import Metrics

    transport = httpx.ASGITransport(app=create_app(Metrics()))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        document = (await client.get("/openapi.json")).json()
    text = page("reference/http.md")
    paths = set(document["paths"])
    assert {"/health", "/reconcile", "/metrics"} <= paths
    missing = [p for p in sorted(paths) if not named(text, p)]
    # the dashboard's routes, as the route tables declare them
    for source in [SRC / "http.py", *sorted((SRC / "web").glob("*.py"))]:
        for route in re.findall(r"(?:Route|Mount)\(\s*\"([^\"]+)\"", source.read_text()):
            if not named(text, route) and not named(text, route + "/…"):
                missing.append(route)
    assert missing == [], "docs/reference/http.md lacks: " + ", ".join(missing)


# --- metrics -------------------------------------------------------------------------------------
def test_every_metric_is_in_the_metrics_reference() -> None:
    from nightcrew.metrics import METRICS

    text = page("reference/metrics.md")
    assert [m for m in METRICS if not named(text, m)] == []


# --- log events ----------------------------------------------------------------------------------
_LEVELS = {"event": "info", "warning": "warning", "error": "error"}


def _called(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _text(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def emitted_events() -> dict[str, set[str]]:
    """Every event name the code logs, with the levels it is logged at: ``event("…")``,
    ``warning("…")``, ``error("…")``; a failure record ``{"event": "…", …}`` (logged with
    ``warning(**failure)`` or ``error(**failure)``, or kept in a report's errors: "trouble");
    a job's ``failed_event`` (error) and a lane's ``completed_event`` (info); the HTTP server's
    once-a-minute tallies and the broker's connection events (warning, but ``…_connected``)."""
    found: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name, first = _called(node), _text(node.args[0]) if node.args else None
                if first is None:
                    continue
                if name in _LEVELS:
                    found.setdefault(first, set()).add(_LEVELS[name])
                elif name in ("_Tally", "on_event", "_broker_event"):
                    level = "info" if first.endswith("_connected") else "warning"
                    found.setdefault(first, set()).add(level)
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if _text(key) == "event" and (event := _text(value)) is not None:
                        found.setdefault(event, set()).add("trouble")
            elif isinstance(node, ast.keyword) and node.arg in ("failed_event", "completed_event"):
                if (event := _text(node.value)) is not None:
                    level = "error" if node.arg == "failed_event" else "info"
                    found.setdefault(event, set()).add(level)
    return found


def test_the_event_extraction_sees_the_spec_events() -> None:
    events = emitted_events()
    # one of each way an event is named in the code
    assert "warning" in events["overage_email_skipped"]
    assert "trouble" in events["overage_email_failed"]
    assert "error" in events["scheduled_reconcile_failed"]
    assert "info" in events["import_watchdog_completed"]
    assert "warning" in events["http_slow_clients_closed"]
    assert len(events) > 100


def test_every_event_is_in_the_events_reference() -> None:
    text = page("reference/events.md")
    missing = sorted(e for e in emitted_events() if not named(text, e))
    assert missing == [], "docs/reference/events.md lacks: " + ", ".join(missing)


def test_every_warning_and_error_has_a_run_book() -> None:
    text = page("how-to/runbooks.md")
    trouble = {e for e, levels in emitted_events().items() if levels - {"info"}}
    missing = sorted(e for e in trouble if not named(text, e))
    assert missing == [], "docs/how-to/runbooks.md lacks: " + ", ".join(missing)


def test_the_spec_event_tables_that_mean_trouble_have_run_books() -> None:
    """Spec 000's event tables name events nightcrew may log rarely, or never on a healthy
    platform: every one of them that means trouble has its entry."""
    spec_trouble = [
        "lifecycle_cron_failed",
        "pause_reactivation_failed",
        "billing_resume_failed",
        "podcast_deletion_failed",
        "r2_cleanup_failed",
        "cache_invalidation_failed",
        "scheduled_reconcile_failed",
        "overage_escalation_failed",
        "overage_escalation_account_failed",
        "overage_email_skipped",
        "overage_email_no_owner",
        "overage_email_failed",
        "unconfirmed_users_reap_failed",
        "import_watchdog_resend_failed",
        "import_watchdog_rescue_resend_failed",
        "import_watchdog_misconfigured",
        "import_watchdog_failed",
        "external_link_watchdog_resend_failed",
        "external_link_watchdog_null_next_attempt",
        "external_link_watchdog_skipped_no_target",
        "external_link_watchdog_misconfigured",
        "external_link_watchdog_failed",
        "hosting_migration_preview_watchdog_failed",
        # spec 001's
        "worker.backpressure.db_count_failed",
        "worker.backpressure.db_count_parse_failed",
        "worker.redis.worker_lock_extend_failed",
    ]
    text = page("how-to/runbooks.md")
    assert [e for e in spec_trouble if not named(text, e)] == []


# --- the news report -----------------------------------------------------------------------------
def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def test_every_news_report_field_is_in_the_reports_reference() -> None:
    from nightcrew.news.report import NewsReport, PassFigures, WorkerResults

    fields = set(NewsReport(shard="s", trigger="manual").to_json())
    for record in (PassFigures, WorkerResults):
        fields |= {_camel(f.name) for f in dataclasses.fields(record)}
    text = page("reference/reports.md")
    assert sorted(f for f in fields if not named(text, f)) == []


# --- the site ------------------------------------------------------------------------------------
def test_every_page_is_in_the_navigation() -> None:
    nav = set(re.findall(r":\s+(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages == nav
    assert {"tutorial.md", "how-to/runbooks.md", "reference/settings.md", "benchmarks.md"} <= nav


_NOTEBOOK = re.compile(
    r"tried and not kept|this session|the session's|re-measured|before/after|slower hour"
    r"|on a slow hour|lab notebook",
    re.I,
)


def _prose(text: str) -> str:
    """The text without its code: fenced blocks and inline spans (examples carry dates)."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


@pytest.mark.parametrize(
    "path",
    [README, *sorted(DOCS.rglob("*.md"))],
    ids=lambda p: str(Path(p).relative_to(ROOT)),
)
def test_no_page_reads_like_a_lab_notebook(path: Path) -> None:
    prose = _prose(path.read_text(encoding="utf-8"))
    assert _NOTEBOOK.findall(prose) == []
    if path.name != "benchmarks.md":  # each figure there carries the date it was measured
        assert re.findall(r"\b20\d\d-\d\d-\d\d\b", prose) == []
