"""`nightcrew news sources import|export`, as an operator moving a feed reader's 2,000
subscriptions: one command in seconds, every skipped entry reported with its line and why, a
file that cannot be parsed refused whole."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.test_cli import _env, _nightcrew, run

pytestmark = pytest.mark.acceptance

# The import of 2,000 feeds must take seconds, not the ~0.5 s per feed of `sources add`.
IMPORT_BUDGET_SECONDS = 10.0


def _stdin(*args: str, data: bytes, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [_nightcrew(), *args], env=env, input=data, capture_output=True, timeout=120, check=False
    )


def _subscriptions() -> tuple[str, dict[int, str]]:
    """A feed reader's export of 2,000 entries in categories two deep, with what such files
    hold: the same feed under two categories, pages that are no feeds, URLs that are none, and
    20 feeds already added (by the URL list the test imports first). Returns the document and
    what each entry's line must come to."""
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<opml version="2.0">',
        "  <head><title>Exported from a reader</title></head>",
        "  <body>",
    ]
    expected: dict[int, str] = {}

    def outline(kind: str, attrs: str) -> None:
        lines.append(f"      <outline {attrs}/>")
        expected[len(lines)] = kind

    for category in range(20):
        lines.append(f'    <outline text="Category {category}" title="Category {category}">')
        lines.append(f'     <outline text="Sub &amp; {category}">')
        for n in range(95):  # 20 x 95 = 1,900 new feeds
            i = category * 95 + n
            name = f"Feed &lt;{i}&gt; &amp; &quot;co&quot;" if i % 7 == 0 else f"Feed {i}"
            outline("added", f'type="rss" text="{name}" xmlUrl="https://f{i}.example/rss"')
        lines.append("     </outline>")
        outline(
            "duplicate", f'type="rss" text="again" xmlUrl="https://f{category * 95}.example/rss"'
        )
        outline(
            "duplicate",
            f'type="rss" text="again" xmlUrl="https://f{category * 95 + 1}.example/rss"',
        )
        outline("exists", f'type="rss" text="old" xmlUrl="https://old{category}.example/rss"')
        outline("missing_xmlurl", f'type="link" text="a page" url="https://p{category}.example/"')
        scheme = "ftp://x.example/feed" if category % 2 else "not a url"
        outline("invalid_url", f'type="rss" text="bad" xmlUrl="{scheme}"')
        lines.append("    </outline>")
    lines += ["  </body>", "</opml>", ""]
    return "\n".join(lines), expected


def _import(path: Path | str, env: dict[str, str], *extra: str) -> dict[str, Any]:
    result = run("news", "sources", "import", str(path), *extra, "--json", env=env)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def _count_sources(env: dict[str, str], shard: str | None = None) -> int:
    listed = run(
        "news", "sources", "list", "--json", *(["--shard", shard] if shard else []), env=env
    )
    assert listed.returncode == 0, listed.stderr
    return len(json.loads(listed.stdout))


@pytest.mark.slow
def test_importing_2000_feeds_reports_every_skip_and_a_second_import_adds_none(
    fresh_db_url: str, tmp_path: Path
) -> None:
    env = _env(DATABASE_URL=fresh_db_url)
    old = "".join(f"https://old{c}.example/rss Old {c}\n" for c in range(20))
    listed_first = f"# added before\n\n{old}".encode()
    first = _stdin(
        "news", "sources", "import", "-", "--shard", "old", "--json", data=listed_first, env=env
    )
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["addedCount"] == 20

    document, expected = _subscriptions()
    opml = tmp_path / "subscriptions.opml"
    opml.write_text(document, encoding="utf-8")

    dry = _import(opml, env, "--dry-run")
    assert dry["dryRun"] is True and dry["addedCount"] == 1900
    assert _count_sources(env) == 20

    started = time.monotonic()
    report = _import(opml, env, "--shard", "eu")
    elapsed = time.monotonic() - started
    assert elapsed < IMPORT_BUDGET_SECONDS, f"2,000 feeds took {elapsed:.2f} s"
    assert report["format"] == "opml" and report["shard"] == "eu"
    assert report["entryCount"] == 2000
    assert report["addedCount"] == 1900
    assert report["skippedByReason"] == {
        "duplicate": 40,
        "exists": 20,
        "invalid_url": 20,
        "missing_xmlurl": 20,
    }
    # every entry is reported on the line it stands on, with the right reason
    reported = {a["line"]: "added" for a in report["added"]}
    reported |= {s["line"]: s["reason"] for s in report["skipped"]}
    assert reported == expected
    dup = next(s for s in report["skipped"] if s["reason"] == "duplicate")
    assert dup["detail"].startswith("the same feed URL as line ")
    exists = next(s for s in report["skipped"] if s["reason"] == "exists")
    assert exists["detail"].startswith("already source ") and "on shard old" in exists["detail"]
    bad = next(s for s in report["skipped"] if s["feedUrl"] == "ftp://x.example/feed")
    assert bad["reason"] == "invalid_url" and "not an http(s) feed URL" in bad["detail"]
    named = {a["feedUrl"]: a["name"] for a in report["added"]}
    assert named["https://f7.example/rss"] == 'Feed <7> & "co"'
    assert _count_sources(env, "eu") == 1900

    again_started = time.monotonic()
    again = _import(opml, env, "--shard", "eu")
    assert time.monotonic() - again_started < IMPORT_BUDGET_SECONDS
    assert again["addedCount"] == 0
    assert again["skippedByReason"] == {
        "duplicate": 40,
        "exists": 1920,
        "invalid_url": 20,
        "missing_xmlurl": 20,
    }
    assert _count_sources(env) == 1920

    # the text report: one line per skipped entry, then the summary
    text = run("news", "sources", "import", str(opml), "--dry-run", env=env)
    assert text.returncode == 0, text.stderr
    out = text.stdout.splitlines()
    assert len(out) == 2000 + 1
    assert out[-1].startswith("dry run: would add 0 of 2000 entries from ")
    assert "skipped 2000 (20 missing_xmlurl, 20 invalid_url, 40 duplicate, 1920 exists)" in out[-1]


@pytest.mark.slow
def test_export_is_opml_that_imports_back(
    fresh_db_url: str, empty_db_url: str, tmp_path: Path
) -> None:
    env = _env(DATABASE_URL=fresh_db_url)
    urls = "https://a.example/rss A & <B>\nhttps://b.example/feed?x=1&y=2\n"
    assert _stdin("news", "sources", "import", "-", data=urls.encode(), env=env).returncode == 0
    assert (
        _stdin(
            "news", "sources", "import", "-", "--shard", "s2", data=b"https://c.example/\n", env=env
        ).returncode
        == 0
    )

    refused = run("news", "sources", "export", env=env)
    assert refused.returncode == 2 and "give --opml" in refused.stderr

    exported = run("news", "sources", "export", "--opml", env=env)
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.startswith(
        '<?xml version="1.0" encoding="UTF-8"?>\n<opml version="2.0">'
    )
    assert 'text="A &amp; &lt;B&gt;"' in exported.stdout
    only_s2 = run("news", "sources", "export", "--opml", "--shard", "s2", env=env)
    assert only_s2.stdout.count("<outline ") == 1 and "https://c.example/" in only_s2.stdout

    path = tmp_path / "export.opml"
    path.write_text(exported.stdout, encoding="utf-8")
    dry = _import(path, env, "--dry-run")
    assert dry["entryCount"] == 3 and dry["skippedByReason"]["exists"] == 3

    # into a fresh database: the same sources, names and all
    other = _env(DATABASE_URL=empty_db_url)
    assert run("db", "migrate", env=other).returncode == 0
    report = _import(path, other)
    assert report["addedCount"] == 3
    assert {(a["name"], a["feedUrl"]) for a in report["added"]} == {
        ("A & <B>", "https://a.example/rss"),
        ("b.example", "https://b.example/feed?x=1&y=2"),
        ("c.example", "https://c.example/"),
    }


def test_a_file_that_cannot_be_parsed_adds_nothing(fresh_db_url: str, tmp_path: Path) -> None:
    env = _env(DATABASE_URL=fresh_db_url)
    document, _ = _subscriptions()
    broken = tmp_path / "broken.opml"
    broken.write_text(document.replace("</body>", "</bdy>"), encoding="utf-8")
    result = run("news", "sources", "import", str(broken), env=env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"nightcrew: {broken}: line {document.count(chr(10)) - 1}, column 5:"
        " not well-formed XML (mismatched tag)"
    ]
    assert result.stdout == ""

    bomb = b'<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">]><opml><body/></opml>'
    refused = _stdin("news", "sources", "import", "-", data=bomb, env=env)
    assert refused.returncode == 2
    assert refused.stderr.decode().strip() == (
        "nightcrew: <stdin>: line 1: refused: the document has a DOCTYPE"
        " (OPML needs none; entities can bomb)"
    )

    missing = run("news", "sources", "import", str(tmp_path / "nope.opml"), env=env)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"nightcrew: cannot read {tmp_path / 'nope.opml'}: No such file or directory"
    )
    assert _count_sources(env) == 0


def test_a_feed_password_is_redacted_in_list_and_export_unless_asked(fresh_db_url: str) -> None:
    env = _env(DATABASE_URL=fresh_db_url)
    url = "https://reader:hunter2-feed-pass@feeds.example/private.xml"
    added = run("news", "sources", "add", url, "--name", "Private", env=env)
    assert added.returncode == 0, added.stderr
    for command in (["list"], ["list", "--json"], ["export", "--opml"]):
        shown = run("news", "sources", *command, env=env)
        assert shown.returncode == 0, shown.stderr
        assert "hunter2-feed-pass" not in shown.stdout, command
        assert "reader:[redacted]@feeds.example" in shown.stdout, command
        revealed = run("news", "sources", *command, "--show-secrets", env=env)
        assert url in revealed.stdout.replace("&amp;", "&"), command
