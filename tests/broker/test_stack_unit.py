"""The supervisor's backoff and the stack's kept secrets, without starting any process."""

from __future__ import annotations

import pathlib

from gigacluster.stack import Stack, StackConfig, load_or_create_secrets, next_backoff


def test_backoff_doubles_on_quick_deaths_and_resets_after_a_healthy_run() -> None:
    """0.5, 1, 2 ... capped at 30 s while a service keeps dying; back to 0.5 s after 60 s up."""
    cfg = StackConfig()
    delay, waits = cfg.restart_backoff_s, []
    for _ in range(8):
        wait, delay = next_backoff(delay, 1.0, cfg)
        waits.append(wait)
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert next_backoff(30.0, 60.0, cfg) == (0.5, 1.0)
    assert next_backoff(30.0, 59.9, cfg) == (30.0, 30.0)
    short = StackConfig(healthy_reset_s=5.0, restart_backoff_s=0.1, restart_backoff_max_s=1.0)
    assert next_backoff(1.0, 5.0, short) == (0.1, 0.2)


def test_secrets_are_kept_in_the_state_dir(tmp_path: pathlib.Path) -> None:
    """Two stacks on one state dir share admin key, service key and MQTT passwords (file mode 0600);
    without a state dir every stack gets fresh ones."""
    a = Stack(StackConfig(state_dir=tmp_path))
    b = Stack(StackConfig(state_dir=tmp_path))
    assert (a.admin_key, a.service_key, a.mqtt_service_password, a.mqtt_admin_password) == (
        b.admin_key, b.service_key, b.mqtt_service_password, b.mqtt_admin_password)
    assert (tmp_path / "secrets.json").stat().st_mode & 0o777 == 0o600
    assert Stack(StackConfig()).admin_key != Stack(StackConfig()).admin_key
    assert load_or_create_secrets(tmp_path)["admin_key"] == a.admin_key
