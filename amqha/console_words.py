"""A console command line's words: each command's arguments and options, and parsing.

Owns: the table of the commands' positional arguments and options (``federation add``
and ``remove`` with theirs), a command's usage line, and splitting words into the
command, its arguments and its options; a bad one is a usage error that says why.

Must not know: servers, what a command does.
"""

from __future__ import annotations

from typing import Any

from .console import usage
from .console_service import COMMANDS

# Each command's arguments: positional names, and its options (flag: True, else a value).
_SYNTAX: dict[str, tuple[tuple[str, ...], dict[str, bool]]] = {
    "status": ((), {}),
    "recover": ((), {}),
    "switchover": ((), {"--wait": False}),
    "config-diff": ((), {}),
    "promote": ((), {"--force": True}),
    "connections": ((), {}),
    "queues": ((), {}),
    "exchanges": ((), {}),
    "bindings": ((), {}),
    "events": ((), {"--follow": True, "-f": True, "--limit": False}),
    "controller": (("stop|start",), {}),
    "maintenance": (("on|off", "SERVER"), {}),
    "purge": (("QUEUE",), {"--vhost": False}),
    "delete": (("QUEUE",), {"--vhost": False, "--if-empty": True, "--if-unused": True}),
    "close-connection": (("NAME",), {"--reason": False}),
    "federation": (("[add|remove]",), {}),
    "users": ((), {}),
    "user": (("add|delete", "NAME"), {"--tags": False, "--password-hash": False}),
    "vhost": (("add|delete", "NAME"), {}),
    "permission": (("set|clear", "VHOST", "USER"), {}),
}
# Each change command's actions.
_ACTIONS = {"user": ("add", "delete"), "vhost": ("add", "delete"), "permission": ("set", "clear")}
# ``federation add`` and ``federation remove``: their options (flag: True, else a value;
# --url may be given twice: a pair's two addresses).
_FEDERATION: dict[str, dict[str, bool]] = {
    "add": {
        "--exchange": False,
        "--upstream": False,
        "--url": False,
        "--vhost": False,
        "--no-bindings": True,
        "--forward": True,
        "--max-hops": False,
        "--delivery": False,
    },
    "remove": {"--exchange": False, "--upstream": False, "--vhost": False, "--drop-pending": True},
}
_REPEATED = ("--url",)


def syntax(command: str) -> str:
    if command == "federation":
        return " | ".join(
            " ".join(
                ["federation", action]
                + [f"[{o}]" if flag else f"[{o} {o[2:].upper()}]" for o, flag in known.items()]
            )
            for action, known in (("", {}), *_FEDERATION.items())
        ).replace("federation  ", "federation ")
    names, options = _SYNTAX[command]
    flags = " ".join(f"[{o}]" if flag else f"[{o} {o[2:].upper()}]" for o, flag in options.items())
    return " ".join(part for part in (command, *names, flags) if part)


def parse_words(words: list[str]) -> tuple[str, list[str], dict[str, Any]]:
    """A command line's words: the command, its positional arguments and its options."""
    if not words:
        usage(f"commands: {', '.join(COMMANDS)}")
    command, rest = words[0], list(words[1:])
    if command not in _SYNTAX:
        usage(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
    names, known = _SYNTAX[command]
    if command == "federation":
        action = rest[0] if rest and not rest[0].startswith("-") else None
        if action is not None and action not in _FEDERATION:
            usage("usage: federation | federation add ... | federation remove ...")
        known = _FEDERATION.get(action or "", {})
    positional: list[str] = []
    options: dict[str, Any] = {}
    while rest:
        word = rest.pop(0)
        if word.startswith("-") and word != "-":
            name, _, value = word.partition("=")
            if name not in known:
                usage(f"{command}: unknown option {name!r}; usage: {syntax(command)}")
            if known[name]:
                options[name] = True
            elif value or rest:
                given = value or rest.pop(0)
                if name in _REPEATED:
                    options.setdefault(name, []).append(given)
                else:
                    options[name] = given
            else:
                usage(f"{command}: {name} needs a value; usage: {syntax(command)}")
        else:
            positional.append(word)
    if command == "federation":
        if len(positional) > 1:
            usage("usage: federation | federation add ... | federation remove ...")
        return command, positional, options
    if len(positional) != len(names):
        usage(f"usage: {syntax(command)}")
    if command == "controller" and positional[0] not in ("stop", "start"):
        usage("usage: controller stop|start")
    if command in _ACTIONS and positional[0] not in _ACTIONS[command]:
        usage(f"usage: {syntax(command)}")
    if command == "maintenance" and positional[0] not in ("on", "off"):
        usage("usage: maintenance on|off SERVER (primary, backup or a server's name)")
    return command, positional, options


def wait_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        usage("switchover: --wait takes seconds from 0 to 3600")
    return value


def events_limit(text: str) -> int:
    if not str(text).isdigit() or not 0 < int(text) <= 1000:
        usage("events: --limit takes a number from 1 to 1000")
    return int(text)
