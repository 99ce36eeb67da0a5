"""Dashboard options, resolved once: defaults < ``AITP_DASHBOARD_*`` environment < flags.

The names follow Flower's (``--port``, ``--address``, ``--basic-auth``, ``--url-prefix``,
``--read-only``; ``FLOWER_PORT`` becomes ``AITP_DASHBOARD_PORT``). Listening on anything
but a loopback address without authentication is refused: the dashboard can change the
migration stage of a whole fleet.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_aitp.errors import PolicyError

ENV_PREFIX = "AITP_DASHBOARD_"
DEFAULT_PORT = 5566  # Flower's is 5555: both can run side by side
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


@dataclass(frozen=True)
class DashboardConfig:
    """Everything the dashboard process needs to know about how it is served."""

    port: int = DEFAULT_PORT
    address: str = "127.0.0.1"
    basic_auth: tuple[tuple[str, str], ...] = ()
    url_prefix: str = ""
    read_only: bool = False
    refresh_s: float = 2.0
    window_s: float = 300.0

    @property
    def auth_required(self) -> bool:
        return bool(self.basic_auth)

    def check_exposure(self) -> None:
        """Refuse a non-loopback address without authentication (raises PolicyError)."""
        if not is_loopback(self.address) and not self.auth_required:
            raise PolicyError(
                f"--address {self.address}: refusing to listen on a non-loopback address "
                "without authentication (anyone who reaches it could change the stage); "
                "add --basic-auth user:password (AITP_DASHBOARD_BASIC_AUTH) or use "
                "--address 127.0.0.1"
            )


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and the usual names of the local host."""
    name = address.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def parse_credentials(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``user:password`` pairs (the password may contain ':'); comma-separated lists too."""
    pairs = []
    for value in values:
        for item in str(value).split(","):
            item = item.strip()
            if not item:
                continue
            user, sep, password = item.partition(":")
            if not sep or not user or not password:
                raise PolicyError(
                    f"--basic-auth {user or '?'}:...: expected user:password with both parts "
                    "non-empty"
                )
            pairs.append((user, password))
    return tuple(pairs)


def normalise_prefix(prefix: str | None) -> str:
    """'' or '/segment[/segment]' without a trailing slash."""
    prefix = (prefix or "").strip().strip("/")
    if not prefix:
        return ""
    if any(c in prefix for c in "?#\\ ") or "//" in prefix:
        raise PolicyError(f"--url-prefix {prefix!r}: expected a plain path such as 'aitp'")
    return "/" + prefix


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise PolicyError(f"{ENV_PREFIX}{name}: expected true or false, got {raw!r}")


def _number(name: str, raw: Any, kind: type, low: float, high: float) -> Any:
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise PolicyError(f"{name}: expected a number, got {raw!r}") from None
    if not low <= value <= high:
        raise PolicyError(f"{name}: {value} is outside {low:g}..{high:g}")
    return value


def from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``AITP_DASHBOARD_*`` values that are set, as raw option values."""
    found: dict[str, Any] = {}
    for option in ("port", "address", "url_prefix", "refresh_s", "window_s"):
        raw = environ.get(ENV_PREFIX + option.upper())
        if raw:
            found[option] = raw
    auth = environ.get(ENV_PREFIX + "BASIC_AUTH")
    if auth:
        found["basic_auth"] = [auth]
    read_only = environ.get(ENV_PREFIX + "READ_ONLY")
    if read_only is not None:
        found["read_only"] = _bool("READ_ONLY", read_only)
    return found


def resolve_config(environ: Mapping[str, str], **flags: Any) -> DashboardConfig:
    """Combine environment and flags (flags win; None or empty means 'not given')."""
    values = from_environment(environ)
    values.update({k: v for k, v in flags.items() if v not in (None, (), [])})
    return DashboardConfig(
        port=_number("--port", values.get("port", DEFAULT_PORT), int, 0, 65535),
        address=str(values.get("address") or "127.0.0.1"),
        basic_auth=parse_credentials(values.get("basic_auth") or ()),
        url_prefix=normalise_prefix(values.get("url_prefix")),
        read_only=bool(values.get("read_only", False)),
        refresh_s=_number("--refresh", values.get("refresh_s", 2.0), float, 0.2, 300),
        window_s=_number("--window", values.get("window_s", 300.0), float, 10, 86400),
    )
