"""Dashboard options: Flower's names, AITP_DASHBOARD_* environment, safe exposure."""

from __future__ import annotations

import pytest

from celery_aitp.dashboard.config import (
    DEFAULT_PORT,
    is_loopback,
    normalise_prefix,
    parse_credentials,
    resolve_config,
)
from celery_aitp.errors import PolicyError


def test_defaults_listen_on_loopback_only():
    config = resolve_config({})
    assert (config.port, config.address, config.read_only) == (DEFAULT_PORT, "127.0.0.1", False)
    assert config.basic_auth == () and config.url_prefix == ""
    config.check_exposure()  # loopback without auth is fine


def test_environment_is_read_and_flags_win():
    env = {"AITP_DASHBOARD_PORT": "7000", "AITP_DASHBOARD_ADDRESS": "0.0.0.0",
           "AITP_DASHBOARD_BASIC_AUTH": "ann:pw1,bob:p:w:2",
           "AITP_DASHBOARD_URL_PREFIX": "/ops/aitp/", "AITP_DASHBOARD_READ_ONLY": "yes"}
    config = resolve_config(env)
    assert config.port == 7000 and config.address == "0.0.0.0"
    assert config.basic_auth == (("ann", "pw1"), ("bob", "p:w:2"))  # password may hold ':'
    assert config.url_prefix == "/ops/aitp" and config.read_only is True
    config.check_exposure()  # authenticated: allowed
    flagged = resolve_config(env, port=7001, basic_auth=("cid:x",), read_only=False)
    assert flagged.port == 7001 and flagged.basic_auth == (("cid", "x"),)
    assert flagged.read_only is False


def test_non_loopback_without_auth_is_refused_with_the_fix_named():
    for address in ("0.0.0.0", "::", "192.0.2.7", "example.org"):
        with pytest.raises(PolicyError, match="--basic-auth"):
            resolve_config({}, address=address).check_exposure()


@pytest.mark.parametrize("address", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"])
def test_loopback_addresses(address):
    assert is_loopback(address)


@pytest.mark.parametrize("bad", ["nopassword", ":pw", "user:", ""])
def test_bad_credentials_are_named(bad):
    if bad == "":
        assert parse_credentials([bad]) == ()
        return
    with pytest.raises(PolicyError, match="user:password"):
        parse_credentials([bad])


def test_bad_values_are_named():
    with pytest.raises(PolicyError, match="--port"):
        resolve_config({"AITP_DASHBOARD_PORT": "eighty"})
    with pytest.raises(PolicyError, match="READ_ONLY"):
        resolve_config({"AITP_DASHBOARD_READ_ONLY": "maybe"})
    with pytest.raises(PolicyError, match="--url-prefix"):
        normalise_prefix("a b")
    assert normalise_prefix("/") == "" and normalise_prefix("x/y/") == "/x/y"


def test_the_server_itself_refuses_an_unauthenticated_public_address():
    from celery_aitp.dashboard.config import DashboardConfig
    from celery_aitp.dashboard.server import make_server

    with pytest.raises(PolicyError, match="non-loopback"):
        make_server(object(), DashboardConfig(address="0.0.0.0"))


def test_proxy_options_from_the_environment_and_flags():
    env = {"AITP_DASHBOARD_PROXY_HEADERS": "true",
           "AITP_DASHBOARD_FORWARDED_ALLOW_IPS": "10.0.0.0/8, 192.0.2.7,10.0.0.0/8",
           "AITP_DASHBOARD_AUTH_HEADER": "X-Forwarded-User",
           "AITP_DASHBOARD_FLOWER_URL": "https://flower.example/fl/"}
    config = resolve_config(env)
    assert config.proxy_headers is True
    assert config.forwarded_allow_ips == ("10.0.0.0/8", "192.0.2.7/32")
    assert config.auth_header == "x-forwarded-user" and config.auth_required
    assert config.flower_url == "https://flower.example/fl"
    flagged = resolve_config(env, proxy_headers=False, forwarded_allow_ips="127.0.0.1")
    assert flagged.proxy_headers is False and flagged.forwarded_allow_ips == ("127.0.0.1/32",)
    defaults = resolve_config({})
    assert (defaults.proxy_headers, defaults.auth_header, defaults.flower_url) == (False, "", "")
    assert defaults.forwarded_allow_ips == ("127.0.0.1/32",)  # uvicorn's default: same host


def test_a_proxy_user_header_counts_as_authentication_for_a_public_address():
    resolve_config({}, address="0.0.0.0", auth_header="X-Auth-Request-User").check_exposure()


def test_a_user_header_trusted_from_anywhere_is_refused():
    config = resolve_config({}, auth_header="X-Forwarded-User", forwarded_allow_ips="*")
    with pytest.raises(PolicyError, match="any client could name itself"):
        config.check_exposure()
    resolve_config({}, proxy_headers=True, forwarded_allow_ips="*").check_exposure()  # no user


@pytest.mark.parametrize(("option", "value", "named"), [
    ("forwarded_allow_ips", "proxy.example", "--forwarded-allow-ips"),
    ("forwarded_allow_ips", "10.0.0.0/33", "--forwarded-allow-ips"),
    ("forwarded_allow_ips", " , ", "--forwarded-allow-ips"),
    ("auth_header", "X Forwarded User", "--auth-header"),
    ("auth_header", "Authorization", "--auth-header"),
    ("auth_header", "X-Forwarded-For", "--auth-header"),
    ("flower_url", "flower.example", "--flower-url"),
    ("flower_url", "ftp://flower.example", "--flower-url"),
    ("flower_url", "https://flower.example/?x=1", "--flower-url"),
])
def test_bad_proxy_options_are_named(option, value, named):
    with pytest.raises(PolicyError, match=named):
        resolve_config({}, **{option: value})
    with pytest.raises(PolicyError, match="PROXY_HEADERS"):
        resolve_config({"AITP_DASHBOARD_PROXY_HEADERS": "sometimes"})


def test_allowed_hosts_from_the_environment_and_flags():
    env = {"AITP_DASHBOARD_ALLOWED_HOSTS": "Ops.Example.org., [::1],10.0.0.7,ops.example.org"}
    assert resolve_config(env).allowed_hosts == ("ops.example.org", "::1", "10.0.0.7")
    assert resolve_config(env, allowed_hosts="aitp-dashboard").allowed_hosts \
        == ("aitp-dashboard",)
    assert resolve_config({}).allowed_hosts == ()  # the loopback names and --address only
    assert resolve_config({}, allowed_hosts="*", basic_auth=("a:b",)).allowed_hosts == ("*",)


@pytest.mark.parametrize("bad", ["https://ops.example.org", "ops.example.org:443",
                                 "ops.example.org/aitp", "ops example", "[::1]:5566", "a..b"])
def test_bad_allowed_hosts_are_named(bad):
    with pytest.raises(PolicyError, match="--allowed-hosts"):
        resolve_config({}, allowed_hosts=bad)


def test_every_option_has_a_flag_and_an_environment_variable():
    from dataclasses import fields

    from celery_aitp.cli.celery_command import aitp
    from celery_aitp.dashboard.config import ENV_PREFIX, DashboardConfig, from_environment

    names = [f.name for f in fields(DashboardConfig)]
    assert {p.name for p in aitp.commands["dashboard"].params} == set(names)
    assert set(from_environment({ENV_PREFIX + n.upper(): "1" for n in names})) == set(names)
