"""A disk that forgets: a FUSE filesystem for power-loss and disk-fault tests.

    python -m tests.lazyfs BACKING MOUNTPOINT

Owns: serving the folder BACKING at MOUNTPOINT with a page cache of its own, as a
machine's kernel keeps one, and losing it the way a power cut does. The model is Jepsen's
LazyFS (docs/durability.md, section 9):

- A write lands in this process's memory, page by page (4 KiB), and is read back from
  there; it reaches BACKING only when its file is fsynced (``fsync`` or ``fdatasync``).
  A truncate waits for the fsync the same way.
- Names are written through at once: a create, rename, link, unlink or mkdir is on
  BACKING when it returns (a new file's name survives a power cut, empty, if its data
  was never fsynced: the harsher order for code that renames before it syncs).
- **A power cut** is the end of this process (``LazyDisk.power_cut``: SIGKILL, then the
  mount is taken down): everything not fsynced is gone, and the next mount over the same
  BACKING sees only what was. The server on it is killed first, so nothing it wrote
  after the cut lands anywhere.
- **Faults**, set by writing a line to ``MOUNTPOINT/.faults`` (never listed; the lines
  are ``LazyDisk.fault``'s): ``fsync eio`` (every fsync fails with EIO and, as on Linux,
  the pages it would have written are marked clean: still read until a power cut, never
  written, so a later fsync that succeeds does not bring them back), ``write eio``,
  ``write enospc`` (every write fails so), ``delay S`` (every write and fsync takes S
  seconds more: a slow disk), each optionally limited to the files whose path contains
  a word (``fsync eio store.sqlite``), and ``clear``.

Files are kept by their backing inode, so a rename or a hard link keeps its unsynced
pages and an unlinked file still open keeps its own. The kernel's own cache holds
nothing across a power cut: the mount is new.

Needs /dev/fuse, libfuse 3 (Debian's fuse3) and mfusepy; ``unavailable()`` says what is
missing, for a test's skip.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAGE = 4096
CONTROL = ".faults"
START_TIMEOUT = 30.0


@dataclass
class Pending:
    """One file's writes not yet fsynced: its pages as written (``dirty``: those an fsync
    is to write; a failed fsync leaves them readable and clean, never to be written, as
    Linux does), its size as written, and the shortest it was truncated to since its
    last fsync (the backing file's bytes from there on read as zeros)."""

    pages: dict[int, bytearray] = field(default_factory=dict)
    dirty: set[int] = field(default_factory=set)  # pages an fsync is to write
    size: int | None = None  # None: the backing file's size
    cut: int | None = None


@dataclass
class Fault:
    op: str  # "fsync" or "write"
    error: int  # an errno, or 0 for a delay only
    delay: float = 0.0
    word: str = ""

    def hits(self, path: str) -> bool:
        return self.word in path


def _parse(line: str) -> list[Fault] | None:
    """The faults a control line sets; None for ``clear``. ValueError for a bad line."""
    words = line.split()
    if words == ["clear"]:
        return None
    if len(words) in (2, 3) and words[0] == "delay":
        seconds = float(words[1])
        word = words[2] if len(words) == 3 else ""
        return [Fault("write", 0, seconds, word), Fault("fsync", 0, seconds, word)]
    errors = {"eio": errno.EIO, "enospc": errno.ENOSPC}
    if len(words) in (2, 3) and words[0] in ("fsync", "write") and words[1] in errors:
        return [Fault(words[0], errors[words[1]], 0.0, words[2] if len(words) == 3 else "")]
    raise ValueError(f"not a fault: {line!r}")


def _operations() -> Any:
    """The filesystem's operations class (mfusepy is imported only where a disk is served)."""
    import mfusepy

    class Forgetful(mfusepy.Operations):
        use_ns = True

        def __init__(self, backing: str) -> None:
            self.backing = os.path.realpath(backing)
            self.pending: dict[int, Pending] = {}
            self.faults: list[Fault] = []
            self.handles: dict[int, tuple[int, int]] = {}  # fh -> (backing fd, inode)
            self.next_handle = 1
            self._mutex = threading.RLock()

        # -- paths and errors

        def _real(self, path: str) -> str:
            return os.path.join(self.backing, path.lstrip("/"))

        def _fault(self, op: str, path: str) -> None:
            for fault in self.faults:
                if fault.op == op and fault.hits(path):
                    if fault.delay:
                        time.sleep(fault.delay)
                    if fault.error:
                        raise mfusepy.FuseOSError(fault.error)

        # -- reading and writing through the page cache

        def _size(self, fd: int, inode: int) -> int:
            entry = self.pending.get(inode)
            if entry is not None and entry.size is not None:
                return entry.size
            return os.fstat(fd).st_size

        def _durable(self, fd: int, entry: Pending | None, position: int, size: int) -> bytes:
            """``size`` bytes at ``position`` as the backing file gives them under the
            pending truncates: zeros past its end or past the shortest cut."""
            limit = os.fstat(fd).st_size
            if entry is not None and entry.cut is not None:
                limit = min(limit, entry.cut)
            data = os.pread(fd, max(0, min(size, limit - position)), position)
            return data.ljust(size, b"\0")

        def _read(self, fd: int, inode: int, size: int, offset: int) -> bytes:
            end = min(offset + size, self._size(fd, inode))
            if end <= offset:
                return b""
            entry = self.pending.get(inode)
            if entry is None:
                return os.pread(fd, end - offset, offset)
            out = bytearray()
            position = offset
            while position < end:
                index, start = divmod(position, PAGE)
                take = min(PAGE - start, end - position)
                page = entry.pages.get(index)
                if page is None:
                    out += self._durable(fd, entry, position, take)
                else:
                    out += page[start : start + take]
                position += take
            return bytes(out)

        def _write(self, fd: int, inode: int, data: bytes, offset: int) -> int:
            size = self._size(fd, inode)
            entry = self.pending.setdefault(inode, Pending())
            position = offset
            view = memoryview(data)
            while view:
                index, start = divmod(position, PAGE)
                take = min(PAGE - start, len(view))
                page = entry.pages.get(index)
                if page is None:
                    page = entry.pages[index] = bytearray(
                        self._durable(fd, entry, index * PAGE, PAGE)
                    )
                page[start : start + take] = view[:take]
                entry.dirty.add(index)
                view = view[take:]
                position += take
            entry.size = max(size, offset + len(data))
            return len(data)

        def _truncate(self, fd: int, inode: int, length: int) -> None:
            entry = self.pending.setdefault(inode, Pending())
            for index in [i for i in entry.pages if i * PAGE >= length]:
                del entry.pages[index]
                entry.dirty.discard(index)
            index, start = divmod(length, PAGE)
            if start and index in entry.pages:
                entry.pages[index][start:] = bytes(PAGE - start)
                entry.dirty.add(index)
            entry.cut = length if entry.cut is None else min(entry.cut, length)
            entry.size = length

        def _sync(self, fd: int, inode: int, path: str) -> None:
            entry = self.pending.get(inode)
            try:
                self._fault("fsync", path)
            except OSError:
                if entry is not None:
                    # Linux marks the pages of a failed fsync clean: still read from the
                    # cache, never written; a power cut takes them.
                    entry.dirty.clear()
                    entry.cut = None
                raise
            if entry is not None:
                if entry.cut is not None:
                    os.ftruncate(fd, entry.cut)
                size = os.fstat(fd).st_size if entry.size is None else entry.size
                for index in sorted(entry.dirty):
                    if index * PAGE < size:
                        os.pwrite(
                            fd, bytes(entry.pages[index][: size - index * PAGE]), index * PAGE
                        )
                os.ftruncate(fd, size)
                if entry.pages.keys() == entry.dirty:
                    del self.pending[inode]
                else:  # the pages a failed fsync left: read from here until a power cut
                    for index in entry.dirty:
                        del entry.pages[index]
                    entry.dirty.clear()
                    entry.cut = None
            os.fsync(fd)

        def _forget(self, inode: int) -> None:
            """Drops an inode's pages once no name and no open file refers to it."""
            if inode not in {i for _, i in self.handles.values()}:
                self.pending.pop(inode, None)

        # -- the operations

        def _handle(self, fd: int) -> int:
            handle = self.next_handle
            self.next_handle += 1
            self.handles[handle] = (fd, os.fstat(fd).st_ino)
            return handle

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            with self._mutex:
                if path == "/" + CONTROL:
                    now = time.time_ns()
                    return {
                        "st_mode": 0o100600,
                        "st_nlink": 1,
                        "st_size": 0,
                        "st_atime": now,
                        "st_mtime": now,
                        "st_ctime": now,
                    }
                st = os.lstat(self._real(path))
                attrs = {
                    key: getattr(st, key)
                    for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size")
                }
                for key in ("st_atime", "st_mtime", "st_ctime"):
                    attrs[key] = getattr(st, key + "_ns")
                entry = self.pending.get(st.st_ino)
                if entry is not None and entry.size is not None:
                    attrs["st_size"] = entry.size
                return attrs

        def readdir(self, path: str, fh: int) -> list[str]:
            names = os.listdir(self._real(path))
            return [".", "..", *(n for n in names if not (path == "/" and n == CONTROL))]

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(self._real(path))
            return {
                key: getattr(st, key)
                for key in (
                    "f_bavail",
                    "f_bfree",
                    "f_blocks",
                    "f_bsize",
                    "f_favail",
                    "f_ffree",
                    "f_files",
                    "f_flag",
                    "f_frsize",
                    "f_namemax",
                )
            }

        def access(self, path: str, amode: int) -> int:
            if path != "/" + CONTROL and not os.access(self._real(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._real(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(self._real(path), uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            if path != "/" + CONTROL:
                os.utime(self._real(path), ns=times) if times else os.utime(self._real(path))
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self._real(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self._real(path))
            return 0

        def unlink(self, path: str) -> int:
            with self._mutex:
                real = self._real(path)
                st = os.lstat(real)
                os.unlink(real)
                if st.st_nlink <= 1:
                    self._forget(st.st_ino)
            return 0

        def rename(self, old: str, new: str) -> int:
            os.rename(self._real(old), self._real(new))
            return 0

        def link(self, target: str, source: str) -> int:
            os.link(self._real(source), self._real(target))
            return 0

        def symlink(self, target: str, source: str) -> int:
            os.symlink(source, self._real(target))
            return 0

        def readlink(self, path: str) -> str:
            return os.readlink(self._real(path))

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            with self._mutex:
                fd = os.open(self._real(path), os.O_RDWR | os.O_CREAT, mode)
                return self._handle(fd)

        def open(self, path: str, flags: int) -> int:
            with self._mutex:
                if path == "/" + CONTROL:
                    return 0
                fd = os.open(
                    self._real(path),
                    os.O_RDWR if os.access(self._real(path), os.W_OK) else os.O_RDONLY,
                )
                handle = self._handle(fd)
                if flags & os.O_TRUNC:
                    self._truncate(fd, self.handles[handle][1], 0)
                return handle

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            with self._mutex:
                if fh == 0:
                    return b""
                fd, inode = self.handles[fh]
                return self._read(fd, inode, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            with self._mutex:
                if fh == 0:
                    return self._control(data)
                self._fault("write", path)
                fd, inode = self.handles[fh]
                return self._write(fd, inode, data, offset)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            with self._mutex:
                if path == "/" + CONTROL:
                    return 0
                if fh:
                    fd, inode = self.handles[fh]
                    self._truncate(fd, inode, length)
                    return 0
                fd = os.open(self._real(path), os.O_RDWR)
                try:
                    self._truncate(fd, os.fstat(fd).st_ino, length)
                finally:
                    os.close(fd)
                return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            with self._mutex:
                if fh == 0:
                    return 0
                fd, inode = self.handles[fh]
                self._sync(fd, inode, path)
                return 0

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            return 0  # names are written through

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            with self._mutex:
                if fh:
                    fd, inode = self.handles.pop(fh)
                    unlinked = os.fstat(fd).st_nlink == 0
                    os.close(fd)
                    if unlinked:
                        self._forget(inode)
                return 0

        def _control(self, data: bytes) -> int:
            for line in data.decode().splitlines():
                if not line.strip():
                    continue
                try:
                    faults = _parse(line)
                except ValueError as error:
                    print(f"lazyfs: {error}", file=sys.stderr, flush=True)
                    raise mfusepy.FuseOSError(errno.EINVAL) from None
                self.faults = [] if faults is None else [*self.faults, *faults]
            return len(data)

    return Forgetful


# -- serving a disk, and the tests' handle on one -----------------------------------------------


def serve(backing: str, mountpoint: str) -> None:
    """Serves BACKING at MOUNTPOINT until unmounted or killed (one thread: a slow disk
    is slow for every file, as one is)."""
    import mfusepy

    mfusepy.FUSE(
        _operations()(backing),
        mountpoint,
        foreground=True,
        nothreads=True,
        fsname="amqha-lazyfs",
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
    )


def unavailable() -> str | None:
    """Why a disk cannot be served here (for a test's skip), or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse: the power-loss filesystem needs FUSE"
    if shutil.which("fusermount3") is None:
        return "no fusermount3: install Debian's fuse3 (make test does)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as error:
        return f"mfusepy cannot load libfuse 3 ({error})"
    return _trial()


_TRIAL: list[str | None] = []


def _trial() -> str | None:
    """Mounts a disk once in this process, to learn whether mounting is allowed here."""
    if not _TRIAL:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="amqha-lazyfs-") as folder:
            disk = LazyDisk(Path(folder))
            try:
                disk.mount()
                (disk.path / "probe").write_bytes(b"x")
                _TRIAL.append(None)
            except (OSError, RuntimeError) as error:
                _TRIAL.append(f"a FUSE filesystem cannot be mounted here ({error})")
            finally:
                disk.unmount()
    return _TRIAL[0]


class LazyDisk:
    """A disk for one server: BACKING is ``root/disk``, mounted at ``root/mnt`` (``path``).

    ``mount``, ``fault(line)``, ``power_cut`` (the server on it must be dead first: kill
    it with SIGKILL), ``unmount``. Every wait is bounded.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.backing = self.root / "disk"
        self.path = self.root / "mnt"
        self.process: subprocess.Popen[bytes] | None = None
        self.mounts = 0
        self.cuts = 0

    def mount(self) -> LazyDisk:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)
        self.mounts += 1
        log = open(self.root / f"lazyfs-{self.mounts}.log", "ab")  # noqa: SIM115 - the child's
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.lazyfs", str(self.backing), str(self.path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parent.parent,
            )
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.ismount(self.path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                text = (self.root / f"lazyfs-{self.mounts}.log").read_text(errors="replace")
                self.unmount()
                raise RuntimeError(f"the power-loss filesystem did not mount: {text.strip()}")
            time.sleep(0.02)
        return self

    def fault(self, line: str) -> None:
        """Sets a fault (``fsync eio``, ``write enospc wal``, ``delay 0.05``, ``clear``)."""
        with open(self.path / CONTROL, "w") as control:
            control.write(line + "\n")

    def power_cut(self) -> None:
        """The disk loses what was not fsynced; mounted again, empty-cached."""
        self._end(signal.SIGKILL)
        self.cuts += 1
        self.mount()

    def unmount(self) -> None:
        self._end(signal.SIGTERM)

    def _end(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            if sig == signal.SIGTERM:
                subprocess.run(
                    ["fusermount3", "-u", "-z", str(self.path)], check=False, capture_output=True
                )
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        if os.path.ismount(self.path) or _dead_mount(self.path):
            subprocess.run(
                ["fusermount3", "-u", "-z", str(self.path)], check=False, capture_output=True
            )
        self.process = None


def _dead_mount(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as error:
        return error.errno == errno.ENOTCONN
    return False


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m tests.lazyfs BACKING MOUNTPOINT")
    serve(sys.argv[1], sys.argv[2])
