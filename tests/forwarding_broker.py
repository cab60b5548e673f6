"""A real broker process whose exchanges are forwarded, as a link with ``forward: true``
sets them up (docs/federation.md, "The link", 6).

``python -m tests.forwarding_broker --config FILE EXCHANGE=UPSTREAM ...``: runs FILE as
``amqha start`` does (standalone, or one server of a pair), and when the server leads (at
once standalone: before any client is read) declares each EXCHANGE (direct, durable) in
vhost ``/`` and forwards it to the hidden queue bound for UPSTREAM. It prints one line per
hidden queue with what it holds then (``hidden QUEUE: N messages``), so a test sees what a
restart or a failover kept. ``--orphan-after SECONDS`` (before the forwards) reports a
buffer queue as an orphan that much sooner than a server does, looking every 0.1 s.
Stopped like any server (SIGTERM).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

from amqha.core import names
from amqha.federation import upstream as upstream_side
from amqha.server import Broker, serve
from config import load_config


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "--config":
        raise SystemExit("usage: python -m tests.forwarding_broker --config FILE EXCHANGE=UP...")
    os.umask(0o077)
    config = load_config(argv[1])
    rest = argv[2:]
    orphan_after = None
    if rest[:1] == ["--orphan-after"]:
        orphan_after = float(rest[1])
        rest = rest[2:]
        upstream_side.ORPHAN_CHECK = 0.1
    forwards = [item.split("=", 1) for item in rest]
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {config.name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

    def ready(broker: Broker) -> None:
        if orphan_after is not None and broker.upstream is not None:
            broker.upstream.orphans.after = orphan_after
        if not broker.leading:
            broker.loop.call_later(0.05, ready, broker)
            return
        vhost = broker.vhost("/")
        for exchange, upstream in forwards:
            vhost.declare_exchange(exchange, "direct", durable=True)
            queue = vhost.set_forward(
                exchange,
                names.forward_queue_name(exchange, upstream),
                upstream,
                config.global_name,
                1,
                time.time(),
            )
            print(f"hidden {queue.name}: {queue.message_count} messages", file=sys.stderr)
        sys.stderr.flush()

    pair = None
    if config.failover.role is not None:
        from failover.controller import FailoverController

        pair = FailoverController
    asyncio.run(serve(config, ready=ready, pair=pair))


if __name__ == "__main__":
    main(sys.argv[1:])
