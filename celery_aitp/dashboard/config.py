"""Dashboard options, resolved once: defaults < ``AITP_DASHBOARD_*`` environment < flags.

The names follow Flower's (``--port``, ``--address``, ``--basic-auth``, ``--url-prefix``,
``--read-only``; ``FLOWER_PORT`` becomes ``AITP_DASHBOARD_PORT``) and uvicorn's
(``--proxy-headers``, ``--forwarded-allow-ips``). Listening on anything but a loopback
address without authentication is refused: the dashboard can change the migration stage
of a whole fleet. It answers only the ``Host`` names it knows (the loopback names, the
address it listens on and ``--allowed-hosts``), so that a web page whose name the attacker
points at 127.0.0.1 (DNS rebinding) can neither read it nor change the stage.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from celery_aitp.errors import PolicyError

ENV_PREFIX = "AITP_DASHBOARD_"
DEFAULT_PORT = 5566  # Flower's is 5555: both can run side by side
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
#: uvicorn's default: only a proxy on the same host is trusted.
DEFAULT_FORWARDED_ALLOW_IPS = ("127.0.0.1",)
TRUST_ANY = "*"
#: A host name (RFC 1123 labels; ``_`` too, as container and service names may have it).
_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*\Z")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+\Z")  # an RFC 9110 token
#: Headers a proxy may not use to name the user: the client or the server sets them.
_RESERVED_HEADERS = frozenset({"authorization", "cookie", "host", "origin", "referer",
                               "content-type", "content-length", "x-forwarded-for",
                               "x-forwarded-proto", "x-aitp-csrf"})


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
    #: Take the scheme and client address from X-Forwarded-Proto / X-Forwarded-For, when
    #: the connection comes from ``forwarded_allow_ips`` (uvicorn's proxy support).
    proxy_headers: bool = False
    #: Addresses or networks of the proxies trusted for forwarded headers and for the
    #: user header (``*``: any, refused together with ``auth_header``).
    forwarded_allow_ips: tuple[str, ...] = DEFAULT_FORWARDED_ALLOW_IPS
    #: A header naming the user, set by an authenticating proxy (oauth2-proxy's
    #: ``X-Forwarded-User``); believed only from ``forwarded_allow_ips``.
    auth_header: str = ""
    #: A running Flower's base URL: task and worker pages link to it.
    flower_url: str = ""
    #: Host names answered besides the loopback names and ``address`` (the public name
    #: behind a reverse proxy, a service name); ``*``: any (refused without authentication).
    allowed_hosts: tuple[str, ...] = ()

    @property
    def auth_required(self) -> bool:
        return bool(self.basic_auth or self.auth_header)

    def check_exposure(self) -> None:
        """Refuse a non-loopback address without authentication, and a user header that
        any client could send (raises PolicyError)."""
        if not is_loopback(self.address) and not self.auth_required:
            raise PolicyError(
                f"--address {self.address}: refusing to listen on a non-loopback address "
                "without authentication (anyone who reaches it could change the stage); "
                "add --basic-auth user:password (AITP_DASHBOARD_BASIC_AUTH), or "
                "--auth-header behind an authenticating proxy, or use --address 127.0.0.1"
            )
        if self.auth_header and TRUST_ANY in self.forwarded_allow_ips:
            raise PolicyError(
                f"--auth-header {self.auth_header}: refusing to believe it from any address "
                "(--forwarded-allow-ips '*'): any client could name itself; list the "
                "authenticating proxy's addresses instead"
            )
        if TRUST_ANY in self.allowed_hosts and not self.auth_required:
            raise PolicyError(
                "--allowed-hosts '*': refusing to answer any Host name without "
                "authentication (a web page could point its own name at this address and "
                "use the dashboard: DNS rebinding); list the names instead, or add "
                "--basic-auth or --auth-header"
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


def canonical_host(name: str) -> str | None:
    """A host name or IP address as compared: lower case, without brackets or a trailing
    dot, addresses in their canonical form; None if it is neither."""
    name = name.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    name = name.removesuffix(".")  # the root: "localhost." is "localhost"
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name if _HOST_NAME.match(name) else None


def _items(values: str | Sequence[str]) -> list[str]:
    """The entries of a comma-separated option, given once or repeated (blanks dropped)."""
    parts = values.split(",") if isinstance(values, str) else \
        [part for value in values for part in str(value).split(",")]
    return [part.strip() for part in parts if part.strip()]


def parse_allowed_hosts(values: str | Sequence[str]) -> tuple[str, ...]:
    """Host names or addresses (comma-separated or a list), or ``*``; normalised."""
    found: list[str] = []
    for item in _items(values):
        name = TRUST_ANY if item == TRUST_ANY else canonical_host(item)
        if name is None:
            raise PolicyError(
                f"--allowed-hosts {item!r}: expected host names or addresses such as "
                "ops.example.org,10.0.0.7 (no scheme, port or path), or '*'")
        found.append(name)
    return tuple(dict.fromkeys(found))


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


def parse_forwarded_allow_ips(values: str | Sequence[str]) -> tuple[str, ...]:
    """IP addresses and networks (comma-separated or a list), or ``*``; normalised."""
    found: list[str] = []
    for item in _items(values):
        if item == TRUST_ANY:
            found.append(TRUST_ANY)
            continue
        try:
            found.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise PolicyError(
                f"--forwarded-allow-ips {item!r}: expected IP addresses or networks such as "
                "127.0.0.1,10.0.0.0/8, or '*'") from None
    if not found:
        raise PolicyError("--forwarded-allow-ips: empty (give the proxy's address)")
    return tuple(dict.fromkeys(found))


def normalise_header_name(name: str | None) -> str:
    """'' or a header name a proxy may set (lower case, as ASGI delivers it)."""
    name = (name or "").strip()
    if not name:
        return ""
    if not _HEADER_NAME.match(name) or name.lower() in _RESERVED_HEADERS:
        raise PolicyError(f"--auth-header {name!r}: expected a header name the proxy sets, "
                          "such as X-Forwarded-User")
    return name.lower()


def normalise_flower_url(url: str | None) -> str:
    """'' or an http(s) base URL without a trailing slash, query or fragment."""
    url = (url or "").strip().rstrip("/")
    if not url:
        return ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query \
            or parts.fragment:
        raise PolicyError(f"--flower-url {url!r}: expected Flower's base URL, such as "
                          "https://flower.example.org or http://127.0.0.1:5555/flower")
    return url


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
    for option in ("port", "address", "url_prefix", "refresh_s", "window_s",
                   "forwarded_allow_ips", "auth_header", "flower_url", "allowed_hosts"):
        raw = environ.get(ENV_PREFIX + option.upper())
        if raw:
            found[option] = raw
    auth = environ.get(ENV_PREFIX + "BASIC_AUTH")
    if auth:
        found["basic_auth"] = [auth]
    for option in ("read_only", "proxy_headers"):
        raw = environ.get(ENV_PREFIX + option.upper())
        if raw is not None:
            found[option] = _bool(option.upper(), raw)
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
        proxy_headers=bool(values.get("proxy_headers", False)),
        forwarded_allow_ips=parse_forwarded_allow_ips(
            values.get("forwarded_allow_ips") or DEFAULT_FORWARDED_ALLOW_IPS),
        auth_header=normalise_header_name(values.get("auth_header")),
        flower_url=normalise_flower_url(values.get("flower_url")),
        allowed_hosts=parse_allowed_hosts(values.get("allowed_hosts") or ()),
    )
