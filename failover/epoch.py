"""Durable storage of this server's failover epoch (docs/failover.md, "Epochs").

Owns: the one-line `epoch` file in the server's data dir, written atomically so that a crash
at any moment leaves either the old epoch or the new one, never a torn file (`write_durably`,
which the pair's other small files use too), and the `pair_time` file: the offset of the
pair's time this server last followed (amqha.clock).

Must not know: when or why the epoch changes (the state machine decides and asks, through
`PersistEpoch`), nor anything about the peer.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

EPOCH_FILE = "epoch"


class EpochFileError(ValueError):
    """The epoch file exists but does not hold a non-negative integer.

    Its message is one line meant for the operator: the file, what is wrong, what to do.
    """


# A server must never serve in an epoch below one it has seen, so a damaged file is not
# silently read as 0: the operator puts a sound value back.
_REPAIR = (
    "write into it the higher of the epoch in the peer's data dir and the last epoch in "
    "this server's event log, then start again"
)


def load_epoch(data_dir: str | os.PathLike[str]) -> int:
    """The stored epoch, or 0 if none was ever stored."""
    path = Path(data_dir) / EPOCH_FILE
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return 0
    except UnicodeDecodeError as exc:
        raise EpochFileError(f"{path}: corrupt (non-ASCII bytes); {_REPAIR}") from exc
    except OSError as exc:
        raise EpochFileError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        epoch = int(text.strip())
    except ValueError as exc:
        raise EpochFileError(
            f"{path}: corrupt (expected one integer, found {text[:40]!r}); {_REPAIR}"
        ) from exc
    if epoch < 0:
        raise EpochFileError(f"{path}: corrupt (epoch must not be negative: {epoch}); {_REPAIR}")
    return epoch


def store_epoch(data_dir: str | os.PathLike[str], epoch: int) -> None:
    """Replace the stored epoch durably."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
    write_durably(data_dir, EPOCH_FILE, f"{epoch}\n")


PAIR_TIME_FILE = "pair_time"


def store_pair_offset(data_dir: str | os.PathLike[str], offset: float) -> None:
    """The offset of the pair's time from this server's clock (amqha.clock), kept for a
    restart."""
    write_durably(data_dir, PAIR_TIME_FILE, f"{offset!r}\n")


def load_pair_offset(data_dir: str | os.PathLike[str]) -> float:
    """The offset kept by ``store_pair_offset``; 0 if none, or unreadable (the server's
    own clock then)."""
    try:
        value = float((Path(data_dir) / PAIR_TIME_FILE).read_text(encoding="ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return 0.0
    return value if value == value and abs(value) < 10 * 365 * 86400 else 0.0


def write_durably(data_dir: str | os.PathLike[str], name: str, text: str) -> None:
    """Replace the small file ``name`` in the data dir: temp file, fsync, rename, fsync the
    directory; a crash leaves the old content or the new, never a torn file."""
    directory = Path(data_dir)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkstemp makes the file 0600: the file is this server's user's only.
    fd, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as temp:
            temp.write(text)
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, directory / name)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    # The rename is durable only once the directory entry is.
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
