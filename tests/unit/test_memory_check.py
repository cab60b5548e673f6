"""The memory watermark is checked the moment partial input passes it, not at the next
tick: a body read faster than the timer ticks must not run far past the watermark."""

import asyncio
from pathlib import Path

import yaml

from amqha.server import Broker
from config import load_config

MiB = 1 << 20


def broker_with_watermark(tmp_path: Path, watermark: int) -> Broker:
    path = tmp_path / "solo.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "server": {"name": "solo", "listen": "127.0.0.1:0", "data_dir": str(tmp_path)},
                "users": [{"name": "guest", "password": "guest"}],
                "limits": {"memory_high_watermark": watermark},
            }
        )
    )
    return Broker(load_config(path))


def test_partial_input_past_the_watermark_blocks_at_once(tmp_path: Path) -> None:
    async def check() -> None:
        broker = broker_with_watermark(tmp_path, 8 * MiB)
        broker.memory.check()
        for _ in range(7):
            broker.memory.count_input(MiB)
        assert not broker.memory.over and not broker.blocked
        broker.memory.count_input(2 * MiB)  # 9 MiB held, and no timer has run
        assert broker.memory.over and broker.blocked
        broker.memory.count_input(-9 * MiB)
        broker.memory.check()
        assert not broker.memory.over and not broker.blocked

    asyncio.run(check())


def test_input_counted_before_a_check_is_not_counted_twice(tmp_path: Path) -> None:
    async def check() -> None:
        broker = broker_with_watermark(tmp_path, 8 * MiB)
        broker.memory.count_input(6 * MiB)
        broker.memory.check()  # the budget now allows for the 6 MiB held
        broker.memory.count_input(MiB)
        assert not broker.memory.over
        broker.memory.count_input(2 * MiB)
        assert broker.memory.over

    asyncio.run(check())
