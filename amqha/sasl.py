"""The credentials in a Connection.StartOk: the PLAIN and AMQPLAIN mechanisms.

Owns: turning a mechanism's response into a user name and a password. Malformed
responses give empty credentials (refused by ``auth`` like any wrong password); an
unknown mechanism is refused here. Knows nothing of users or of the connection.
"""

from __future__ import annotations

import struct

from pamqp import decode, exceptions

MECHANISMS = "PLAIN AMQPLAIN"


def credentials(mechanism: str, response: str | bytes) -> tuple[str, str]:
    raw = (
        response.encode("utf-8", "surrogateescape")
        if isinstance(response, str)
        else bytes(response)
    )
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            return "", ""
        return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
    if mechanism == "AMQPLAIN":
        try:
            # AMQPLAIN sends a field table without its length prefix.
            _, table = decode.field_table(struct.pack(">I", len(raw)) + raw)
        except Exception:
            return "", ""
        return _as_text(table.get("LOGIN", "")), _as_text(table.get("PASSWORD", ""))
    raise exceptions.AMQPAccessRefused(
        f"ACCESS_REFUSED - unsupported authentication mechanism '{mechanism}'"
    )


def _as_text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
