"""One server per data dir: ``DATA_DIR/server.lock``, held while the server runs.

Owns: taking the lock at start (``take``; a second server on the same data dir is refused,
naming the pid that holds it: two servers writing one store would corrupt it), and who
holds it (``holder``: the pid of the amqha server that does, if one does), which
``amqha pair`` reads to follow a server restarted by hand with the line it printed
(docs/operations.md, "Running the pair").

The lock is ``flock``'s: the kernel releases it when the process ends, however it ends
(kill -9 too), so a crash never leaves a data dir locked. The file holds the pid, for
the messages.

Must not know: the store, the broker, the pair.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "server.lock"
# A probe of the lock (``holder``) holds it for an instant: a server starting then tries
# again for this long before it calls the data dir taken.
TAKE_FOR = 2.0


class DataDirInUse(Exception):
    """Another process holds the data dir."""


def take(data_dir: str | Path) -> int:
    """Hold the data dir's lock for as long as this process runs (the descriptor is
    returned, to keep); DataDirInUse if another server holds it."""
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    path = Path(data_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + TAKE_FOR
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            if time.monotonic() >= deadline:
                pid = _pid_in(fd)
                os.close(fd)
                who = f"pid {pid}" if pid is not None else "another process"
                raise DataDirInUse(
                    f"{data_dir} is in use by another amqha server ({who}): two servers "
                    "writing one store would corrupt it; stop that one first"
                ) from None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def holder(data_dir: str | Path) -> int | None:
    """The pid of the amqha server that holds ``data_dir``, or None (nobody holds it, or
    what holds it is not an amqha process)."""
    path = Path(data_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            pid = _pid_in(fd)  # held: by whom
            return pid if pid is not None and _is_amqha(pid) else None
        fcntl.flock(fd, fcntl.LOCK_UN)  # nobody held it
        return None
    finally:
        os.close(fd)


def _pid_in(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _is_amqha(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"amqha" in command
