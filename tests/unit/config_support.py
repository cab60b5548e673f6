"""What the config.loader tests share: a valid file of a pair's primary (``VALID``), writing
a file and changing or dropping one of its keys, and the check that a bad file is refused
with an error naming the file, the key and the problem (``assert_error``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]

VALID: dict[str, Any] = {
    "server": {"name": "alpha", "listen": "127.0.0.1:5999", "data_dir": "/tmp/alpha"},
    "users": [
        {"name": "guest", "password": "guest", "vhosts": ["/", "other"]},
        {"name": "peer", "password": "secret", "tags": ["peering"]},
        {"name": "root", "password": "root", "tags": ["administrator", "monitoring"]},
    ],
    "failover": {
        "role": "primary",
        "peer": "127.0.0.1:6000",
        "heartbeat": 0.5,
        "timeout": 2,
        "peer_user": "peer",
        "secret": "correct horse battery staple",
    },
    "events": {"path": "/tmp/alpha/events.jsonl"},
    "limits": {
        "frame_max": 8192,
        "channel_max": 100,
        "heartbeat": 10,
        "max_message_size": "16MiB",
        "memory_high_watermark": "1.5GB",
    },
}


def write(tmp_path: Path, data: Any, name: str = "server.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def with_change(section: str, key: str, value: Any) -> dict[str, Any]:
    data = yaml.safe_load(yaml.safe_dump(VALID))
    data.setdefault(section, {})[key] = value
    return data


def assert_error(tmp_path: Path, data: Any, key: str, *problem: str) -> ConfigError:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    error = caught.value
    message = str(error)
    assert message.startswith(f"{path}: {key}: "), message
    assert error.path == str(path) and error.key == key
    for fragment in problem:
        assert fragment in error.problem, message
    return error


def without(section: str, key: str) -> dict[str, Any]:
    data = yaml.safe_load(yaml.safe_dump(VALID))
    del data[section][key]
    return data
