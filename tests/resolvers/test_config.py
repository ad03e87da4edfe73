"""Configuration from the environment: values checked, bad ones named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from py_vapid import Vapid02

from resolvers.adapters.webpush import load_vapid, new_private_key, public_key
from resolvers.core.config import ConfigError, Settings

ROOT = Path(__file__).resolve().parents[2]


def test_values_are_read_and_typed() -> None:
    settings = Settings.from_env(
        {
            "MIFAMILIAS_PORT": "9000",
            "MIFAMILIAS_ALLOWED_ORIGINS": "https://a.example, https://b.example",
            "MIFAMILIAS_REDIS_URL": "",
            "MIFAMILIAS_KEEP_ORIGINAL_METADATA": "1",
            "OTHER": "ignored",
        }
    )
    assert settings.keep_original_metadata is True
    assert Settings.from_env({}).keep_original_metadata is False
    assert settings.port == 9000
    assert settings.allowed_origins == ("https://a.example", "https://b.example")
    assert settings.redis_url is None  # empty is unset
    assert settings.base_url == "http://127.0.0.1:9000"


def test_a_bad_value_names_the_variable_and_the_value() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"MIFAMILIAS_PORT": "eighty", "MIFAMILIAS_UNLOCK_POLL_SECONDS": "soon"})
    message = str(refused.value)
    assert "MIFAMILIAS_PORT='eighty'" in message and "integer" in message
    assert "MIFAMILIAS_UNLOCK_POLL_SECONDS='soon'" in message


def test_parts_are_at_least_s3s_smallest() -> None:
    settings = Settings.from_env({"MIFAMILIAS_MULTIPART_THRESHOLD_BYTES": "0"})
    assert settings.multipart_threshold_bytes == 0  # every upload in parts
    assert settings.multipart_part_bytes == 8 * 1024 * 1024
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"MIFAMILIAS_MULTIPART_PART_BYTES": "1048576"})
    assert "MIFAMILIAS_MULTIPART_PART_BYTES='1048576'" in str(refused.value)


def app_command(data_dir: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """`python app.py ARGS` with only `env` and a data directory set."""
    return subprocess.run(
        [sys.executable, str(ROOT / "app.py"), *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "MIFAMILIAS_DATA_DIR": str(data_dir), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_line_refuses_bad_configuration_without_a_traceback(tmp_path: Path) -> None:
    done = app_command(tmp_path, ["token", "ana"], MIFAMILIAS_MAX_BODY_BYTES="1MB")
    assert done.returncode == 2
    assert "MIFAMILIAS_MAX_BODY_BYTES='1MB'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_server_on_dynamodb_refuses_to_start_without_a_vapid_key() -> None:
    """Either variable that selects DynamoDB makes the key a requirement of
    `serve`: its message says why, and how to make one."""
    for engine in (
        {"MIFAMILIAS_DYNAMODB_ENDPOINT": "http://127.0.0.1:1"},
        {"MIFAMILIAS_AWS_REGION": "eu-west-1"},
    ):
        settings = Settings.from_env(engine)  # other commands (create-table, token) run
        with pytest.raises(ConfigError) as refused:
            settings.check_serving()
        message = str(refused.value)
        assert "MIFAMILIAS_VAPID_PRIVATE_KEY is needed with DynamoDB" in message
        assert "refuses pushes signed by another's" in message
        assert "python app.py vapid-key" in message
        Settings.from_env({**engine, "MIFAMILIAS_VAPID_PRIVATE_KEY": new_private_key()}).check_serving()
    # The embedded store is one host's: it generates its own key, as a fresh clone needs.
    Settings.from_env({}).check_serving()


def test_a_vapid_key_that_is_no_private_key_is_refused_and_not_shown() -> None:
    vapid = Vapid02.from_raw(new_private_key().encode())
    for wrong in (public_key(vapid), "not-a-key"):  # the public key, pasted by mistake
        with pytest.raises(ConfigError) as refused:
            Settings.from_env({"MIFAMILIAS_VAPID_PRIVATE_KEY": wrong})
        message = str(refused.value)
        assert "MIFAMILIAS_VAPID_PRIVATE_KEY='<not shown>'" in message and wrong not in message
    pem = vapid.private_pem().decode()
    assert Settings.from_env({"MIFAMILIAS_VAPID_PRIVATE_KEY": pem}).vapid_private_key == pem


def test_the_vapid_key_command_prints_a_key_the_setting_takes(tmp_path: Path) -> None:
    # It reads no settings: it runs where `serve` is refused for want of its key.
    done = app_command(tmp_path, ["vapid-key"], MIFAMILIAS_AWS_REGION="eu-west-1")
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert done.stdout == key + "\n"  # the key alone, for $(python app.py vapid-key)
    settings = Settings.from_env({"MIFAMILIAS_AWS_REGION": "eu-west-1", "MIFAMILIAS_VAPID_PRIVATE_KEY": key})
    settings.check_serving()
    # The public key it names is the one the server will give browsers.
    assert public_key(load_vapid(tmp_path, settings.vapid_private_key)) in done.stderr
    assert not list(tmp_path.iterdir())  # nothing generated: the key was given
