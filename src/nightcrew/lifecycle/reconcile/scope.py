"""What every phase of one storage-reconciler run shares (the size backfill, the missing check)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from nightcrew.db.database import Tx
from nightcrew.lifecycle.reconcile.core import ReconcileOptions
from nightcrew.lifecycle.reconcile.records import Progress
from nightcrew.runtime import Runtime


@dataclass(frozen=True, kw_only=True, slots=True)
class RunScope:
    runtime: Runtime  # on a dry run, its dry-run view: nothing it is asked to do changes anything
    conn: Tx  # the session that holds the listing and its temporary tables
    options: ReconcileOptions
    prefix: str  # the object-key prefix R2_PUBLIC_URL's keys have
    now: datetime
    tick: Progress
