"""``nightcrew demo`` and ``serve --demo``: a sample platform on the embedded PostgreSQL.

- ``seed.py`` (+ ``seed.sql``): the sample podcast platform, each row named for the story;
- ``story.py``: the demo's database, both lanes run on it, the outcome told in words;
- ``news.py``: the news worker's part of the story, on ``feeds.py``'s sample feeds.
"""

from nightcrew.demo.news import repoint_sample_feeds
from nightcrew.demo.story import DEMO_DATABASE, demo_database, run_demo

__all__ = ["DEMO_DATABASE", "demo_database", "repoint_sample_feeds", "run_demo"]
