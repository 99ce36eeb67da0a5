"""``celery -A proj aitp dashboard``: the web dashboard, JSON API and Prometheus metrics.

Options follow Flower's names; each has an ``AITP_DASHBOARD_*`` environment equivalent
(flags win). Needs the ``dashboard`` extra (Starlette and uvicorn).
"""

from __future__ import annotations

import os

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, fail
from celery_aitp.errors import PolicyError


@click.command("dashboard")
@click.option("--port", type=int, default=None,
              help="Port to listen on (default 5566; AITP_DASHBOARD_PORT).")
@click.option("--address", default=None,
              help="Address to bind (default 127.0.0.1; AITP_DASHBOARD_ADDRESS). A non-loopback "
                   "address requires --basic-auth.")
@click.option("--basic-auth", "basic_auth", multiple=True, metavar="USER:PASSWORD",
              help="Require HTTP basic auth (repeat for several users; "
                   "AITP_DASHBOARD_BASIC_AUTH takes a comma-separated list).")
@click.option("--url-prefix", default=None,
              help="Serve under this path, e.g. behind a reverse proxy "
                   "(AITP_DASHBOARD_URL_PREFIX).")
@click.option("--read-only/--no-read-only", "read_only", default=None,
              help="Hide and disable stage control (AITP_DASHBOARD_READ_ONLY).")
@click.option("--refresh", "refresh_s", type=float, default=None,
              help="Seconds between page refreshes and store reads (default 2; "
                   "AITP_DASHBOARD_REFRESH_S).")
@click.option("--window", "window_s", type=float, default=None,
              help="Seconds of recent runs and decisions the pages summarise (default 300; "
                   "AITP_DASHBOARD_WINDOW_S).")
@click.option("--proxy-headers/--no-proxy-headers", "proxy_headers", default=None,
              help="Behind a reverse proxy: take the scheme and client address from "
                   "X-Forwarded-Proto and X-Forwarded-For, from --forwarded-allow-ips only "
                   "(AITP_DASHBOARD_PROXY_HEADERS).")
@click.option("--forwarded-allow-ips", default=None, metavar="ADDRESSES",
              help="Comma-separated addresses or networks of the proxies to trust, for "
                   "--proxy-headers and --auth-header (default 127.0.0.1; "
                   "AITP_DASHBOARD_FORWARDED_ALLOW_IPS).")
@click.option("--auth-header", default=None, metavar="HEADER",
              help="Trust this header (e.g. X-Forwarded-User, set by oauth2-proxy) to name "
                   "the signed-in user, from --forwarded-allow-ips only "
                   "(AITP_DASHBOARD_AUTH_HEADER).")
@click.option("--allowed-hosts", default=None, metavar="NAMES",
              help="Comma-separated host names the dashboard answers to besides localhost, "
                   "127.0.0.1, [::1] and --address, e.g. its public name behind a reverse "
                   "proxy; other Host headers get 403 (DNS rebinding); '*' for any, only "
                   "with authentication (AITP_DASHBOARD_ALLOWED_HOSTS).")
@click.option("--flower-url", default=None, metavar="URL",
              help="A running Flower's base URL: task and worker pages link to it "
                   "(AITP_DASHBOARD_FLOWER_URL).")
@click.pass_context
def command(ctx: click.Context, **flags: object) -> None:
    """Serve the dashboard, /api/..., /metrics, /healthz and /readyz."""
    from celery_aitp.dashboard.config import resolve_config

    try:
        config = resolve_config(os.environ, **flags)
        config.check_exposure()
    except PolicyError as exc:
        fail(str(exc))
    middleware = middleware_of(ctx)
    try:
        from celery_aitp.dashboard.server import serve
    except ImportError as exc:
        fail(f"the dashboard needs its extra: pip install 'celery-aitp[dashboard]' ({exc})")
    auth = f", basic auth for {len(config.basic_auth)} user(s)" if config.basic_auth else ""
    if config.auth_header:
        auth += f", user from {config.auth_header}"
    if config.proxy_headers or config.auth_header:
        auth += f", trusting proxies at {','.join(config.forwarded_allow_ips)}"
    if config.allowed_hosts:
        auth += f", answering Host {','.join(config.allowed_hosts)} too"
    mode = ", read-only" if config.read_only else ""
    host = f"[{config.address}]" if ":" in config.address else config.address
    console.print(f"celery_aitp dashboard on http://{host}:{config.port}{config.url_prefix}/"
                  f"{auth}{mode}")
    serve(middleware, config)
