"""Configuration from the environment: values checked, bad ones named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_command_line_refuses_bad_configuration_without_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "token", "ana"],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "MIFAMILIAS_MAX_BODY_BYTES": "1MB",
            "MIFAMILIAS_DATA_DIR": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "MIFAMILIAS_MAX_BODY_BYTES='1MB'" in done.stderr
    assert "Traceback" not in done.stderr
