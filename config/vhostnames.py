"""What a vhost name may be (pure): shared by the config loader and a definitions import.

Owns: the rule. A vhost name is text of 1 to 255 bytes (an AMQP shortstr, as
Connection.Open carries it) with no control character (NUL, newline, carriage return,
any below U+0020, DEL): such a name cannot be written in a log line, a config file or an
event record without being mistaken for something else (docs/security.md).

Must not know: users, the broker.
"""

from __future__ import annotations

MAX_BYTES = 255


def vhost_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a vhost name, or None if it can."""
    if not isinstance(name, str):
        return f"a vhost name must be text, got {type(name).__name__}"
    if not name:
        return "a vhost name cannot be empty"
    if len(name.encode("utf-8", "surrogateescape")) > MAX_BYTES:
        return f"a vhost name is at most {MAX_BYTES} bytes"
    bad = next((c for c in name if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        return f"vhost name {name[:64]!r} holds the control character U+{ord(bad):04X}"
    return None
