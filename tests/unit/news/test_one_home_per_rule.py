"""Each spec 001 setting is read by the one module whose rule it sets, and the pipeline's stage
names are written once: a second reader or a second copy is a rule that can drift apart in the
two engines. Read from the source, so it holds for code no test happens to run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import nightcrew

SRC = Path(nightcrew.__file__).parent

# spec 001's settings (their Settings attributes) and the one module that may read each
HOMES = {
    "max_ai_reviews": "news/steps/review.py",
    "ingestion_backpressure_queue_limit": "news/steps/admission.py",
    "ingestion_backpressure_db_article_limit": "news/steps/admission.py",
    "worker_lock_ttl_seconds": "news/steps/leases.py",
    "ai_review_lock_ttl_seconds": "news/steps/review.py",
}


def _readers(attribute: str) -> set[str]:
    pattern = re.compile(rf"\bsettings\.{attribute}\b")
    return {
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.name != "config.py" and pattern.search(path.read_text())
    }


@pytest.mark.parametrize("attribute", sorted(HOMES))
def test_each_spec_001_setting_is_read_by_its_rules_module_alone(attribute: str) -> None:
    assert _readers(attribute) == {HOMES[attribute]}


def test_the_pipelines_stage_names_are_written_once() -> None:
    spelled = re.compile(r"""["']fetch["'],\s*["']enrich["'],\s*["']review["'],\s*["']write["']""")
    homes = {
        str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if spelled.search(path.read_text())
    }
    assert homes == {"setting_parsers.py"}


def test_the_news_modules_are_of_a_readable_size() -> None:
    """No module of the news worker over 500 lines."""
    sizes = {
        str(path.relative_to(SRC)): len(path.read_text().splitlines())
        for path in (SRC / "news").rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > 500} == {}
