"""The hot modules compiled to C by mypyc, used only when built from the sources beside
them (docs/performance.md, "The compiled modules").

``make compiled`` (run before ``make run``, ``make test`` and the rest) calls
``build()``: it compiles ``MODULES`` into ``build/compiled/`` with a stamp naming the
Python and each source's SHA-256. Importing ``amqha`` calls ``install()``: when the stamp
matches the sources as they are now, a finder at the front of ``sys.meta_path`` loads
exactly those modules from their extension files; anything else (no build, a source
edited since, another Python, ``AMQHA_INTERPRETED=1``) leaves every module interpreted,
with the same behaviour, only slower. So an edit to a compiled module is never hidden
by an older build: until ``make`` builds it again, the source runs.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

# Relative to the checkout's root. Each is type-checked by `make lint` (mypy), which is
# what mypyc compiles from.
MODULES = (
    "amqha/wire.py",
    "amqha/core/codec.py",
    "amqha/store_write.py",
    "amqha/core/message.py",
    "amqha/core/changes.py",
    "amqha/core/queue.py",
    "amqha/core/confirms.py",
    "amqha/core/priority.py",
    "amqha/core/vhost.py",
    "amqha/core/dedup.py",
    "amqha/connection.py",
    "amqha/channel.py",
    "amqha/channel_parts.py",
    "amqha/channel_publish.py",
    "amqha/channel_tx.py",
)
NAMES = tuple(name[:-3].replace("/", ".") for name in MODULES)  # as imported

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "compiled"
STAMP = "stamp.json"
DISABLE = "AMQHA_INTERPRETED"
BUILD_TIMEOUT = 900  # seconds; a build takes 20-25 s here, nearly all of it the C compiler


# The build, run in a child process: mypyc writes each module's C to a file of its own in
# one shared library (multi_file: calls between the modules stay direct), and the C
# compiler runs on those files side by side, one per core (distutils compiles an
# extension's sources one after another). docs/testing.md, "The set-up".
BUILD_SCRIPT = """
import os, sys
from concurrent.futures import ThreadPoolExecutor
from setuptools import setup
from distutils.ccompiler import CCompiler  # after setuptools: its own distutils
from mypyc.build import mypycify

def compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
            extra_preargs=None, extra_postargs=None, depends=None):
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)
    def one(obj):
        src, ext = build[obj]
        self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(one, [obj for obj in objects if obj in build]))
    return objects

CCompiler.compile = compile
setup(name='amqha_compiled',
      ext_modules=mypycify(sys.argv[1:], opt_level='3', multi_file=True),
      script_args=['build_ext', '--build-lib', 'lib', '--build-temp', 'tmp'])
"""


def expected_stamp() -> dict[str, Any]:
    """What a build for these sources and this interpreter records."""
    return {
        "python": sys.version,
        "abi": sys.implementation.cache_tag,
        "build": hashlib.sha256(BUILD_SCRIPT.encode()).hexdigest(),
        "sources": {
            name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest() for name in MODULES
        },
    }


def _built() -> bool:
    """Whether BUILD holds a build of the sources as they are now, for this Python."""
    try:
        recorded = json.loads((BUILD / STAMP).read_text())
        expected = expected_stamp()
    except (OSError, ValueError):
        return False  # no build, or a source gone (an installed copy without them)
    return isinstance(recorded, dict) and all(
        recorded.get(key) == value for key, value in expected.items()
    )


class _Finder(importlib.abc.MetaPathFinder):
    """Finds exactly the built extension modules, by their dotted names."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def _extension_files(folder: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for file in folder.rglob(f"*{suffix}"):
            parts = file.relative_to(folder).parts
            name = ".".join((*parts[:-1], parts[-1][: -len(suffix)]))
            files.setdefault(name, str(file))
    return files


def install() -> bool:
    """Load the compiled modules if a build matches the sources; True if it did."""
    if os.environ.get(DISABLE) or any(isinstance(f, _Finder) for f in sys.meta_path):
        return False
    if not _built():
        return False
    files = _extension_files(BUILD / "lib")
    if not set(NAMES) <= files.keys():
        return False
    sys.meta_path.insert(0, _Finder(files))
    return True


def describe() -> str:
    """How this process runs the hot modules, for a server's start line."""
    loaded = active()
    if loaded:
        return f"compiled ({', '.join(loaded)})"
    if os.environ.get(DISABLE):
        return f"interpreted ({DISABLE} is set)"
    return "interpreted (no compiled build matches the sources: make compiled)"


def active() -> list[str]:
    """The compiled modules loaded in this process (for logs and tests)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return [
        name
        for name in NAMES
        if str(getattr(sys.modules.get(name), "__file__", "")).endswith(suffixes)
    ]


def build() -> int:
    """Compile MODULES into BUILD unless a matching build is there; 0 on success or when
    compiling is not possible here (said on stderr: the sources then run interpreted)."""
    if _built() and (BUILD / "lib").is_dir():
        print("compiled hot path: up to date", file=sys.stderr)
        return 0
    import shutil
    import subprocess
    import tempfile

    stamp = expected_stamp()
    staging = Path(tempfile.mkdtemp(prefix="amqha-compile-"))
    try:
        # setuptools reads the project file of the folder it runs in: the build runs in a
        # folder of its own, on absolute paths.
        script = BUILD_SCRIPT
        sources = [str(ROOT / name) for name in MODULES]
        try:
            done = subprocess.run(
                [sys.executable, "-c", script, *sources],
                cwd=staging,
                capture_output=True,
                text=True,
                env={**os.environ, "MYPYPATH": str(ROOT)},
                timeout=BUILD_TIMEOUT,
            )
            output, failed = (done.stderr or done.stdout), done.returncode != 0
        except subprocess.TimeoutExpired:
            output, failed = f"the build took more than {BUILD_TIMEOUT} s", True
        if failed:
            tail = "\n".join(output.strip().splitlines()[-15:])
            print(
                f"compiled hot path: not built, the modules run interpreted:\n{tail}",
                file=sys.stderr,
            )
            return 0
        BUILD.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(BUILD / "lib", ignore_errors=True)
        (BUILD / STAMP).unlink(missing_ok=True)
        shutil.copytree(staging / "lib", BUILD / "lib")
        (BUILD / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"compiled hot path: built {', '.join(MODULES)}", file=sys.stderr)
    return 0
