"""Reading a YAML configuration file: the document, its mappings, its common values.

Owns: parsing the text (a key given twice refused, ``--set`` overrides applied),
``Section`` (one mapping read key by key: types, ranges, sizes, unknown keys reported),
``host:port`` addresses, loopback addresses, names, and the files a config names (read
relative to its folder). Each problem is a ``ConfigError`` naming the file and the key.

Must not know: what the sections mean (``sections.py``, ``federation.py``, ``loader.py``),
the broker, sockets, the event loop.
"""

from __future__ import annotations

import ipaddress
import math
from pathlib import Path
from typing import Any

import yaml

from amqha.core import names

from .schema import ConfigError


def parse_host_port(path: str, key: str, value: Any) -> tuple[str, int]:
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(path, key, f"expected 'host:port', got {value!r}")
    host, _, port_text = value.rpartition(":")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ConfigError(
            path, key, f"an IPv6 address needs brackets, as in '[::1]:5672', got {value!r}"
        )
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(path, key, f"port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(path, key, f"port {port} is out of range 0..65535")
    if not host:
        raise ConfigError(path, key, "host is empty")
    return host, port


SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}


class Section:
    """Reads one mapping, remembering which keys were used so unknown ones are reported."""

    def __init__(self, path: str, prefix: str, data: Any) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(
                path, prefix or "(top level)", f"expected a mapping, got {type(data).__name__}"
            )
        self.path, self.prefix, self.data = path, prefix, data
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def get(self, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        self.used.add(name)
        if name not in self.data or self.data[name] is None:
            return default
        value = self.data[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and kind is not bool:
            raise ConfigError(
                self.path, self.key(name), f"expected {_kind_name(kind)}, got a boolean"
            )
        if not isinstance(value, kind):
            raise ConfigError(
                self.path, self.key(name), f"expected {_kind_name(kind)}, got {value!r}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(self.path, self.key(name), f"expected a finite number, got {value}")
        return value

    def positive(self, name: str, kind: type, default: Any, minimum: float = 0) -> Any:
        value = self.get(name, kind, default)
        if value <= minimum:
            raise ConfigError(
                self.path, self.key(name), f"must be greater than {minimum}, got {value}"
            )
        return value

    def size(self, name: str, default: int) -> int:
        self.used.add(name)
        value = self.data.get(name, default)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        if isinstance(value, str):
            text = value.strip().lower().replace(" ", "")
            number = text.rstrip("kmgib")
            unit = text[len(number) :]
            if unit in SIZE_UNITS:
                try:
                    parsed = int(float(number) * SIZE_UNITS[unit])
                except (ValueError, OverflowError):
                    parsed = 0
                if parsed > 0:
                    return parsed
        raise ConfigError(
            self.path, self.key(name), f"expected a size like 1048576 or '512MiB', got {value!r}"
        )

    def count(self, name: str, default: int, minimum: int = 0) -> int:
        value = self.get(name, int, default)
        if value < minimum:
            raise ConfigError(self.path, self.key(name), f"must be {minimum} or more, got {value}")
        return value

    def section(self, name: str) -> Section:
        self.used.add(name)
        return Section(self.path, self.key(name), self.data.get(name))

    def check_unknown(self) -> None:
        unknown = sorted(set(map(str, self.data)) - self.used)
        if unknown:
            raise ConfigError(self.path, self.key(unknown[0]), "unknown key")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        list: "a list",
        dict: "a mapping",
    }
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


def check_name(path: str, key: str, value: str | None) -> None:
    """A server or pair name ends up in queue names and headers (docs/federation.md)."""
    if value is not None:
        problem = names.name_problem(value)
        if problem is not None:
            raise ConfigError(path, key, problem)


def read_yaml(path: str, text: str) -> Any:
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
        if document is not None:
            _refuse_duplicate_keys(path, document, "")
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(file)"
        raise ConfigError(
            path, where, f"not valid YAML: {getattr(error, 'problem', error)}"
        ) from None


def override(path: str, data: Any, key: str, value: Any) -> Any:
    """``data`` with the dotted ``key`` set to ``value`` (sections made as needed)."""
    names = key.split(".")
    if not all(names):
        raise ConfigError(path, key, "an override needs a dotted key such as server.listen")
    top = {} if data is None else data
    section = top
    for index, name in enumerate(names[:-1]):
        if not isinstance(section, dict):
            break
        section = section.setdefault(name, {})
        if not isinstance(section, dict):
            where = ".".join(names[: index + 1])
            raise ConfigError(path, where, f"is not a section, so {key} cannot be set")
    if not isinstance(section, dict):
        raise ConfigError(path, key, "the file is not a mapping of sections")
    section[names[-1]] = value
    return top


def _refuse_duplicate_keys(path: str, node: yaml.Node, prefix: str) -> None:
    """PyYAML keeps the last of two equal keys; a file that says two things is refused."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            name = f"{prefix}.{key}" if prefix else str(key)
            if key is not None and key != "<<":
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(path, name, f"given twice (lines {seen[key]} and {line})")
                seen[key] = line
            _refuse_duplicate_keys(path, value_node, name)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_duplicate_keys(path, item, f"{prefix}[{index}]")


def file_path(path: str, key: str, value: str) -> str:
    """A path from the config, relative to the config file's folder; it must be readable."""
    resolved = Path(path).resolve().parent / Path(value).expanduser()
    try:
        with open(resolved, "rb"):
            pass
    except OSError as error:
        raise ConfigError(path, key, f"cannot read {str(resolved)!r}: {error.strerror}") from None
    return str(resolved)


def text_file(path: str, key: str, value: str) -> str:
    """The text of a file the config names (a secret, a password), trailing newline dropped."""
    if value.startswith("local/") and not (Path(path).resolve().parent / value).exists():
        raise ConfigError(
            path,
            key,
            f"{value} does not exist yet: `make run` (amqha pair --config-dir"
            f" {Path(path).parent}) makes this install's own on its first run",
        )
    resolved = file_path(path, key, value)
    try:
        return Path(resolved).read_text(encoding="utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ConfigError(path, key, f"{resolved!r} is not UTF-8 text") from None


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (IPv4-mapped loopback too) or ``localhost``; any other name or
    address, ``0.0.0.0`` and ``::`` included, may be reached from elsewhere."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
