"""Passwords out of everything we show: ``redis://user:secret@host`` -> ``redis://user:***@host``.

Broker and store URLs carry credentials. Dashboard pages, the JSON API, metrics, CLI
output and the middleware's own log lines never print a URL from the configuration; the
texts they do print that come from elsewhere (client libraries' error messages, a
user-supplied URL echoed back) pass through :func:`redact` first, as kombu's
``maybe_sanitize_url`` does for Celery's start-up banner (kombu masks with ``**``; we use
``***``). Query-string passwords (``?password=...``, which redis-py accepts) are masked too.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
# scheme://user:password@ ; the password runs to the last '@' before the host (an
# unencoded '@' in a password must not leave its tail visible)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/\s]*):"
                       r"(?P<password>[^/\s]*)@")
_QUERY = re.compile(r"(?P<key>[?&;](?:password|passwd|pass|pwd)=)[^&;\s]*", re.IGNORECASE)


def redact(text: Any) -> str:
    """``text`` as a string with every URL password replaced by ``***``."""
    text = str(text)
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m['key']}{MASK}", text)
