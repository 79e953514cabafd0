"""Text from anywhere (an error, a reply, a candidate's message) cut down to what a line can show."""

from __future__ import annotations

from typing import Optional


def first_line(text: Optional[str], limit: Optional[int] = None) -> Optional[str]:
    """The first line that is not blank, stripped and clipped to `limit` characters; None when there is none."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:limit] if limit else line.strip()
    return None
