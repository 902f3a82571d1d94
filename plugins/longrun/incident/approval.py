"""Approval texts (Airflow human-in-the-loop) that show what came from an alert without obeying it.

The Airflow UI renders an approval's body as Markdown. Alert records are written by the job, so a
suspect node name, a `why_unnamed` or any other alert string may carry links, images, HTML or fake
instructions. `safe_text` turns any value into inert text: control characters removed, HTML and Markdown
punctuation escaped, clipped. sdc_incident registers it as the Jinja filter `longrun_safe`.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

LIMIT = 2000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>:])")


def safe_text(value: Any, limit: int = LIMIT) -> str:
    """`value` (a string, or any JSON-able value) as text that renders literally in Markdown and HTML."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = _CONTROL.sub(" ", text)
    if len(text) > limit:
        text = text[:limit] + " [clipped]"
    return _MARKDOWN.sub(r"\\\1", html.escape(text, quote=True))
