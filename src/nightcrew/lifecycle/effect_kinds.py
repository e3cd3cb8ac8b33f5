"""The lifecycle's own effect kinds, handed to the runtime at assembly (``assembly.py``):
``billing_resume`` (Stripe, after a reactivation) and ``feed_invalidate`` (the platform's
feed-invalidation outbox). The effects package delivers them without knowing what they are."""

from __future__ import annotations

from collections.abc import Mapping

from nightcrew.effects.deliver import EffectHandler
from nightcrew.lifecycle import billing_resume, feed_outbox


def effect_handlers() -> Mapping[str, EffectHandler]:
    return {h.kind: h for h in (billing_resume.HANDLER, feed_outbox.HANDLER)}
