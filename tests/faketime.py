"""One server's wall clock moved at will, for the clock-step tests and ``make nemesis``:
the server runs under Debian's libfaketime, its wall clock at the offset a file holds,
its monotonic clock real (docs/durability.md, "When a clock steps").

Owns: the library's path, the environment that puts one server under it, and writing an
offset. ``unavailable()`` says why it cannot be done here (for a skip).
"""

from __future__ import annotations

import platform
from pathlib import Path

from tests.support import ServerProcess

LIBFAKETIME = Path(f"/usr/lib/{platform.machine()}-linux-gnu/faketime/libfaketime.so.1")


def unavailable() -> str | None:
    if not LIBFAKETIME.exists():
        return (
            f"libfaketime is not installed ({LIBFAKETIME}; Debian's package libfaketime,"
            " installed by make)"
        )
    return None


def fake_clock(server: ServerProcess, folder: Path) -> Path:
    """Start ``server`` under libfaketime, its wall clock at the offset the returned file
    holds ("+0" now; a write is seen at the next reading), its monotonic clock real."""
    offset = folder / f"{server.name}.faketime"
    offset.write_text("+0\n")
    server.env = {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        # Read again at most once a second. With FAKETIME_NO_CACHE=1 (read at every call)
        # the PASSIVE's heartbeat thread missed its ticks for 0.4 to 0.9 s, 10 times in one
        # run of the clock-step test (its peer lost it, its feed was dropped); with a 1 s
        # cache, never.
        "FAKETIME_CACHE_DURATION": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    return offset


def set_offset(offset: Path, seconds: int) -> None:
    """The faked clock ``seconds`` from the real one, at the server's next reading."""
    staged = offset.with_suffix(".new")
    staged.write_text(f"{seconds:+d}\n")
    staged.replace(offset)
