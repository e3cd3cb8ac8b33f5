"""The storage reconciler (spec 000 "Storage Reconciliation (Epic 13 A.5)")."""
