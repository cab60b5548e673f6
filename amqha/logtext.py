"""Text a client chose, made safe for a log line; an error's chain, for wording it.

Owns: ``error_chain`` (an error and what caused it, each once), and ``escaped``, which every log call that formats a client-chosen name (queue,
exchange, consumer tag, user, vhost, a reply text naming one of them, a peer's state
message) passes that text through. A queue named "q\\n2026-01-01 ... ERROR ..." must not
forge a line of its own in the server's log, nor an escape sequence drive the
operator's terminal.

Must not know: logging itself (callers log), the protocol.
"""

from __future__ import annotations

from collections.abc import Iterator


def escaped(value: object) -> str:
    """``str(value)`` with every character that is not printable (newlines, carriage
    returns, tabs, ESC, U+2028...) written as ``repr`` writes it (``\\n``, ``\\x1b``,
    ``\\u2028``); printable text, quotes and backslashes included, is left as it is."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def error_chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error``, then what caused it (or was being handled), each once: a failed
    connect's chain can loop, an error being the cause of its own context."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__
