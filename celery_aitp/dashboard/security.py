"""Host names, authentication, cross-site request protection and response headers.

* Every request (the probes included) must name in ``Host`` one of the names the
  dashboard answers to: the loopback names, the address it listens on, and the names of
  ``--allowed-hosts``. Anything else gets 403, before any route runs: a page whose own
  name the attacker points at 127.0.0.1 (DNS rebinding) is same-origin with it for the
  browser, and would otherwise read every page and pass the origin check below, which
  compares with whatever ``Host`` says.
* Authentication (when configured) covers every route except ``/healthz``, ``/readyz``
  and ``/healthcheck``, which orchestrators probe without credentials. Two ways, either
  or both: basic auth (passwords compared in constant time), or a user header set by an
  authenticating proxy (oauth2-proxy style), believed only when the connection itself
  comes from one of the trusted proxy addresses; from anywhere else it is ignored.
* A state-changing request must be JSON, come from the dashboard's own origin (``Origin``
  or ``Referer``, and ``Sec-Fetch-Site`` when the browser sends it) and carry the
  double-submit token: the ``X-AITP-CSRF`` header equal to the ``aitp_csrf`` cookie,
  which is ``SameSite=Strict`` so a cross-site page can neither send nor read it.
* Every response forbids framing and inline scripts (Content-Security-Policy).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from celery_aitp.dashboard.config import TRUST_ANY, canonical_host, is_loopback

CSRF_COOKIE = "aitp_csrf"
CSRF_HEADER = "x-aitp-csrf"
OPEN_PATHS = ("/healthz", "/readyz", "/healthcheck")
MAX_USER_LEN = 200
MAX_HOST_SHOWN = 100
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
     b"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


def check_basic_auth(header: str | None, credentials: tuple[tuple[str, str], ...]) -> str | None:
    """The authenticated user name, or None.

    Compares SHA-256 digests with ``hmac.compare_digest`` (equal lengths, so neither the
    content nor the length of a password shows in the time taken) against every known
    pair, without an early exit.
    """
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, _, password = decoded.partition(":")
    given_user, given_password = _digest(user), _digest(password)
    found = None
    for known_user, known_password in credentials:  # no early exit: constant work per try
        ok_user = hmac.compare_digest(given_user, _digest(known_user))
        ok_password = hmac.compare_digest(given_password, _digest(known_password))
        if ok_user & ok_password:
            found = known_user
    return found


class TrustedPeers:
    """The addresses a proxy may connect from: IP networks, or ``*`` for any."""

    def __init__(self, entries: Iterable[str]) -> None:
        entries = tuple(entries)
        self.any = "*" in entries
        self.networks = tuple(ipaddress.ip_network(e, strict=False) for e in entries
                              if e != "*")

    def __contains__(self, host: object) -> bool:
        if self.any:
            return True
        try:
            address = ipaddress.ip_address(str(host))
        except ValueError:  # no address (a unix socket, a test client): never trusted
            return False
        return any(address in network for network in self.networks)


def host_of(header: str) -> str | None:
    """The name in a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), canonical;
    None if it is malformed."""
    value = header.strip()
    if value.startswith("["):
        name, bracket, port = value[1:].partition("]")
        if not bracket or ":" not in name or (port and not port.startswith(":")):
            return None  # brackets hold an IPv6 address, then nothing or a port
        port = port[1:]
    else:
        name, _, port = value.partition(":")
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    return canonical_host(name) if name else None


class AllowedHosts:
    """The ``Host`` names the dashboard answers to, with any port: the loopback names
    (localhost, 127.0.0.0/8, [::1]), the address it listens on and the names listed;
    ``*`` among them: any."""

    def __init__(self, names: Iterable[str] = (), address: str = "") -> None:
        names = tuple(names)
        self.any = TRUST_ANY in names
        self.names = frozenset(n for n in map(canonical_host, (*names, address))
                               if n is not None)

    def allows(self, header: str | None) -> bool:
        if self.any:
            return True
        name = host_of(header or "")
        return name is not None and (name in self.names or is_loopback(name))


def proxy_user(value: str | None) -> str | None:
    """The user a proxy named, trimmed; None if empty or not printable text."""
    user = (value or "").strip()[:MAX_USER_LEN]
    return user if user and user.isprintable() else None


class SecurityMiddleware:
    """ASGI middleware: authentication and security headers for the whole app.

    It must wrap the forwarded-headers middleware, so that the peer it checks against
    the trusted proxies is the connection's own address, not a forwarded one.
    """

    def __init__(self, app: ASGIApp, credentials: tuple[tuple[str, str], ...],
                 prefix: str = "", realm: str = "celery_aitp", auth_header: str = "",
                 trusted: TrustedPeers | None = None,
                 hosts: AllowedHosts | None = None) -> None:
        self.app = app
        self.hosts = hosts or AllowedHosts()
        self.credentials = credentials
        self.open_paths = tuple(prefix + p for p in OPEN_PATHS)
        self.realm = realm
        self.auth_header = auth_header.lower()
        self.trusted = trusted or TrustedPeers(())

    @property
    def auth_required(self) -> bool:
        return bool(self.credentials or self.auth_header)

    def user_of(self, scope: Scope) -> str | None:
        """Who the request is from: the proxy's user header (from a trusted peer only),
        else basic auth; None if neither."""
        headers = _headers(scope)
        if self.auth_header:
            peer = (scope.get("client") or (None,))[0]
            if peer in self.trusted:
                user = proxy_user(headers.get(self.auth_header))
                if user is not None:
                    return user
        if self.credentials:
            return check_basic_auth(headers.get("authorization"), self.credentials)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + SECURITY_HEADERS
            await send(message)

        host = _headers(scope).get("host")
        if not self.hosts.allows(host):
            await _plain(send_with_headers, 403, unknown_host_message(host))
            return
        if self.auth_required and scope.get("path") not in self.open_paths:
            user = self.user_of(scope)
            if user is None:
                await self._refuse(send_with_headers)
                return
            scope.setdefault("state", {})["user"] = user
        await self.app(scope, receive, send_with_headers)

    async def _refuse(self, send: Send) -> None:
        if self.credentials:
            await _plain(send, 401, b"authentication required\n",
                         [(b"www-authenticate", f'Basic realm="{self.realm}"'.encode())])
        else:  # no password prompt: only the proxy can sign a user in
            await _plain(send, 401, b"authentication required: sign in through the "
                                    b"authenticating proxy\n")


def unknown_host_message(host: str | None) -> bytes:
    """Why a request naming ``host`` is refused, and the option that allows it."""
    if not host:
        return b"no Host header: this dashboard answers only requests that name it\n"
    shown = "".join(c if c.isprintable() and c.isascii() else "?" for c in host)
    return (f"Host {shown[:MAX_HOST_SHOWN]!r} is not a name this dashboard answers to "
            "(protection against DNS rebinding); if it is this dashboard's own name, add "
            "it with --allowed-hosts (AITP_DASHBOARD_ALLOWED_HOSTS)\n").encode()


async def _plain(send: Send, status: int, body: bytes,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"content-length", str(len(body)).encode())] + (extra or [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def _origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}".lower()


def cross_site_problem(headers: dict[str, str], scheme: str, cookies: dict[str, str]) -> str | None:
    """Why a state-changing request must be refused, or None if it is same-site."""
    host = headers.get("host", "").lower()
    own = f"{scheme}://{host}"
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site and fetch_site not in ("same-origin", "none"):
        return f"cross-site request refused (Sec-Fetch-Site: {fetch_site})"
    origin = headers.get("origin")
    referer = headers.get("referer")
    claimed = _origin_of(origin) if origin and origin != "null" else None
    if claimed is None and referer:
        claimed = _origin_of(referer)
    if origin == "null" or (claimed is not None and claimed != own):
        hint = ""
        forwarded = headers.get("x-forwarded-proto")
        if forwarded and forwarded != scheme:
            hint = (f"; behind a proxy serving {forwarded}, start the dashboard with "
                    "--proxy-headers and --forwarded-allow-ips <the proxy's address>")
        return f"cross-site request refused (origin {origin or referer} is not {own}{hint})"
    if not headers.get("content-type", "").lower().startswith("application/json"):
        return "expected Content-Type: application/json"
    token, cookie = headers.get(CSRF_HEADER, ""), cookies.get(CSRF_COOKIE, "")
    if not token or not cookie or not hmac.compare_digest(token.encode(), cookie.encode()):
        return f"missing or wrong {CSRF_HEADER} token (reload the page)"
    return None
