"""The overage escalation's emails: plain text and HTML a person would be glad to receive."""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime

STAGE_SUBJECTS = {
    0: "Your account is over its plan limits — you have 30 days",
    1: "Reminder: your account is still over its plan limits",
    2: "Your account is still over its plan limits — the deadline is getting close",
    3: "Final notice: your feeds will be paused in 3 days",
    4: "Some of your podcast feeds are paused",
    "restored": "You're back within your plan — your feeds are live again",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Overage:
    podcasts: int
    podcast_cap: float | None
    bytes: int
    storage_cap_gb: float | None
    deadline: datetime | None
    app_url: str

    def lines(self) -> list[str]:
        out = []
        if self.podcast_cap is not None and self.podcasts > self.podcast_cap:
            out.append(
                f"{self.podcasts} podcasts on a plan that includes {int(self.podcast_cap)} "
                f"({self.podcasts - int(self.podcast_cap)} over)"
            )
        if self.storage_cap_gb is not None and self.bytes > self.storage_cap_gb * 1e9:
            used, cap = self.bytes / 1e9, float(self.storage_cap_gb)
            out.append(
                f"{used:.2f} GB of audio stored on a plan that includes {cap:g} GB "
                f"({used - cap:.2f} GB over)"
            )
        return out


def render(stage: int | str, overage: Overage, suspended: list[str]) -> tuple[str, str, str]:
    """(subject, text, html) for a stage: 0-3 the warnings, 4 the suspension, 'restored'."""
    # Without PUBLIC_APP_URL there is no deep link to give; say where to go instead.
    app = overage.app_url.rstrip("/")
    billing = f"{app}/settings/billing" if app else "your account's billing settings"
    podcasts = f"{app}/podcasts" if app else "your podcast list"
    deadline = f"{overage.deadline:%d %B %Y}" if overage.deadline else "soon"
    subject = STAGE_SUBJECTS[stage]
    if stage == "restored":
        paragraphs = ["Good news: your account is back within its plan limits."]
        if suspended:
            paragraphs.append(
                "Every feed we had paused is being served again — listeners and "
                "apps will pick them up within minutes. Nothing was deleted at "
                "any point."
            )
        else:
            paragraphs.append("No feed was ever paused, and there is nothing more to do.")
        paragraphs.append(f"Your plan and usage: {billing}")
    elif stage == 4:
        paragraphs = [
            "Your account has been over its plan limits for 30 days, so we have paused "
            "these feeds:",
            *[f"  • {name}" for name in suspended],
            "Nothing has been deleted: your podcasts, episodes and audio are all still there, "
            "and you can keep working on them.",
            f"To bring them back, upgrade your plan ({billing}) or remove podcasts or audio "
            f"you no longer need ({podcasts}). The feeds come back on their own within a day "
            "of your account fitting its plan again.",
        ]
    else:
        when = f"by {deadline}"
        if stage == 3:  # after a gap the deadline may be past: the notice always runs 3 days
            when = "within the next 3 days"
        paragraphs = [
            "Your account is currently over its plan limits:",
            *[f"  • {line}" for line in overage.lines()],
            f"Please bring it within your plan {when}. After that the feeds over the limit "
            "will be paused (not deleted) until it fits again.",
            f"You can upgrade your plan: {billing}",
            f"or remove podcasts or audio you no longer need: {podcasts}",
            "If you have already done so, thank you — you can ignore this message; we check "
            "every day.",
        ]
    text = "Hello,\n\n" + "\n\n".join(paragraphs) + "\n\n— The podcast hosting team\n"
    body = "".join(
        f"<li>{html.escape(p.strip()[2:])}</li>"
        if p.startswith("  • ")
        else f"<p>{html.escape(p)}</p>"
        for p in paragraphs
    )
    markup = (
        f"<!doctype html><html><body><p>Hello,</p>{body}"
        f"<p>— The podcast hosting team</p></body></html>"
    ).replace("</p><li>", "</p><ul><li>")
    markup = markup.replace("</li><p>", "</li></ul><p>")
    return subject, text, markup
