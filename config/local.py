"""Per-install credentials for the loopback pair: nothing secret is shipped.

Owns: the ``local/`` folder beside the shipped configs (``config/local/``, listed in
.gitignore) and the three files in it, each one random value on one line: the pair's
shared secret (``pair.secret``, read as ``failover.secret_file``) and the passwords of
the ``admin`` and ``peering`` users (``admin.password``, ``peering.password``, read as
``users[].password_file``). ``amqha pair`` (what ``make run`` starts) makes whichever
of the files its configs name is missing, ``make demo`` its own; ``amqha console``
reads ``admin.password`` for its default servers. The folder is 0700 and each file
0600, and a file appears whole or not at all (written beside it, synced, then linked
into place), so a crash never leaves an empty secret that a later start would read.

Must not know: the broker, how the loader validates what it reads.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

import yaml

LOCAL = "local"
SECRET = "pair.secret"
ADMIN_PASSWORD = "admin.password"
PEERING_PASSWORD = "peering.password"
FILES = (SECRET, ADMIN_PASSWORD, PEERING_PASSWORD)


def named_in(configs: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The files under ``local/`` that these config files read (``failover.secret_file``,
    ``users[].password_file``), by name: a config of one's own names none, and nothing is
    made for it."""
    names: list[str] = []
    for config in configs:
        try:
            data = yaml.safe_load(Path(config).read_text())
        except (OSError, yaml.YAMLError):
            continue  # the loader says what is wrong with it
        if not isinstance(data, dict):
            continue
        failover = data.get("failover")
        users = data.get("users")
        paths = [failover.get("secret_file") if isinstance(failover, dict) else None]
        if isinstance(users, list):
            paths += [user.get("password_file") for user in users if isinstance(user, dict)]
        for value in paths:
            if isinstance(value, str) and value.startswith(f"{LOCAL}/"):
                name = value[len(LOCAL) + 1 :]
                if name and "/" not in name and name not in names:
                    names.append(name)
    return names


def ensure_credentials(
    config_dir: str | os.PathLike[str], names: Iterable[str] = FILES
) -> list[Path]:
    """Make ``CONFIG_DIR/local/`` and each of the files ``names`` that is missing; returns
    the files made (none when every one was there: values are never replaced)."""
    names = list(names)
    if not names:
        return []
    folder = Path(config_dir) / LOCAL
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    made = []
    for name in names:
        path = folder / name
        if path.exists():
            continue
        making = folder / f".{name}.new"
        making.unlink(missing_ok=True)
        descriptor = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(descriptor, 0o600)
            os.write(descriptor, f"{secrets.token_urlsafe(32)}\n".encode())
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            # Fails if another run made the file meanwhile: that one is kept.
            with contextlib.suppress(FileExistsError):
                os.link(making, path)
                made.append(path)
        finally:
            making.unlink()
    if made:
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    return made


def read_credential(config_dir: str | os.PathLike[str], name: str) -> str | None:
    """One of the files, without its newline; None if it was never made."""
    try:
        return (Path(config_dir) / LOCAL / name).read_text(encoding="utf-8").rstrip("\r\n")
    except FileNotFoundError:
        return None
