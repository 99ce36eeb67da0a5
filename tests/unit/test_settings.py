"""Settings: defaults < app.conf aitp_* < AITP_* environment < install() overrides."""

from __future__ import annotations

import pytest

from celery_aitp.deployment import store_url_for
from celery_aitp.errors import PolicyError
from celery_aitp.settings import Settings, resolve_settings


def test_layers_apply_in_order():
    conf = {"aitp_key_prefix": "fromconf", "aitp_refresh_interval_s": 2.0}
    env = {"AITP_KEY_PREFIX": "fromenv"}
    s = resolve_settings(conf, environ=env)
    assert s.key_prefix == "fromenv" and s.refresh_interval_s == 2.0
    s = resolve_settings(conf, environ=env, key_prefix="fromarg")
    assert s.key_prefix == "fromarg"


def test_policy_from_conf_dict_and_env_path(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("stage: split\n")
    assert resolve_settings({"aitp_policy": {"stage": "takeover"}}, environ={}).policy.stage.value \
        == "takeover"
    assert resolve_settings({}, environ={"AITP_POLICY": str(path)}).policy.stage.value == "split"


def test_bad_setting_names_the_key():
    with pytest.raises(PolicyError, match="aitp_refresh_interval_s"):
        resolve_settings({"aitp_refresh_interval_s": -1}, environ={})


def test_store_url_defaults_to_a_redis_broker_and_is_required_otherwise():
    s = Settings()
    assert store_url_for(s, "redis://h:6379/2") == "redis://h:6379/2"
    with pytest.raises(PolicyError, match="aitp_store_url"):
        store_url_for(s, "amqp://guest:guest@h//")
    assert store_url_for(Settings(store_url="redis://s/1"), "amqp://x//") == "redis://s/1"


def test_store_url_error_does_not_leak_credentials():
    with pytest.raises(PolicyError) as info:
        store_url_for(Settings(), "amqp://user:secret@host//")
    assert "secret" not in str(info.value)
