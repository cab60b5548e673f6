"""The federation of one server: a link per federated exchange, run while it leads.

Owns: making the links of the ``federation`` section and of those added at run time
(``runtime``: ``data_dir/federations.json``), adding and removing the latter (the
console's ``federation add|remove``: the buffer queue deleted upstream, or its deletion
kept and retried while this server leads; a forwarding link's hidden queue removed),
starting the links when the server leads (or at start when standalone) and stopping
them when it follows, and the status of every link ("What a link reports",
"At run time" in docs/federation.md).

Must not know: how a link connects or routes (``link``), the pair's state machine, the
console's wire format.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from config.federation import federated_exchange, federation_upstream
from config.schema import ConfigError, FederatedExchange, FederationUpstream, ServerConfig
from config.tls import client_context

from ..core import names
from . import runtime
from .link import Link

if TYPE_CHECKING:
    from ..host import FederationHost

log = logging.getLogger("amqha.federation")

# Seconds between two tries of the buffer queue deletions still to do upstream.
PENDING_RETRY = 2.0
# The options of ``federation add`` as the console names them, by the key the checks use.
OPTIONS = {
    "exchange": "--exchange",
    "upstream": "--upstream",
    "vhost": "--vhost",
    "bindings": "--no-bindings",
    "forward": "--forward",
    "max_hops": "--max-hops",
    "delivery": "--delivery",
}


class Refused(Exception):
    """A run-time change refused: the console's error code and why."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


def _bad_option(error: ConfigError) -> Refused:
    key = error.key.split(".")[0].split("[")[0]
    option = OPTIONS.get(key, error.key if error.key.startswith("--") else f"--{key}")
    return Refused("usage", f"federation add: {option}: {error.problem}")


def _key(spec: FederatedExchange) -> tuple[str, str, str]:
    return (spec.exchange, spec.vhost, spec.upstream)


class Federation:
    """Every link of this server: the ``federation`` section's and those added at run time.

    ``set_leading(True)`` starts the links, ``set_leading(False)`` stops them (a PASSIVE
    keeps none); ``close()`` stops them for good; ``status()`` lists every link, running
    or not; ``add`` and ``remove`` change the run-time ones."""

    def __init__(
        self, broker: FederationHost, on_event: Callable[[str, dict[str, Any]], None] | None = None
    ) -> None:
        config: ServerConfig = broker.config
        federation = config.federation
        self.broker = broker
        self.config = config
        self.on_event = on_event
        self.name = config.global_name
        # Raises ConfigError (naming the file) if the run-time federations cannot be read.
        self.runtime = runtime.load(config.data_dir, [u.name for u in federation.upstreams])
        self._drop_shadowed()
        self._forget_removed()
        self._on_event = on_event
        self.id = config.federation_id if federation.exchanges or self.runtime.exchanges else ""
        peer_tls = config.failover.peer_tls
        self.tls = None if peer_tls is None else client_context(peer_tls, config.source)
        self.links = [self._link(exchange, "config") for exchange in federation.exchanges] + [
            self._link(exchange, "console") for exchange in self.runtime.exchanges
        ]
        self.leading = False
        self._change: asyncio.Task[None] | None = None
        self._retry: asyncio.Task[None] | None = None

    def _forget_removed(self) -> None:
        """A link of the config file that ran here and is no longer in it: its buffer queue
        is deleted upstream (a pending deletion, retried while this server leads)."""
        configured = {_key(e) for e in self.config.federation.exchanges}
        gone = [k for k in self.runtime.known if _key(k.spec) not in configured]
        if not gone:
            return
        for record in gone:
            log.warning(
                "federation: %s is no longer in the config: its buffer queue %r goes upstream",
                record.spec,
                record.queue,
            )
        self.runtime.known = [k for k in self.runtime.known if k not in gone]
        self.runtime.pending = [
            *self.runtime.pending,
            *(k for k in gone if k not in self.runtime.pending),
        ]
        runtime.save(self.config.data_dir, self.runtime)

    def _link_event(self, name: str, record: dict[str, Any]) -> None:
        """A link's event: passed on, and a config link's first run remembered (with its
        buffer queue) so that its removal from the config deletes that queue upstream."""
        if record.get("kind") == "link_up":
            for link in self.links:
                spec = link.spec
                if link.source != "config" or (spec.exchange, spec.vhost, spec.upstream) != (
                    record.get("exchange"),
                    record.get("vhost"),
                    record.get("upstream"),
                ):
                    continue
                known = runtime.PendingDeletion(
                    spec.exchange,
                    spec.upstream,
                    spec.vhost,
                    link.buffer_queue,
                    tuple(link.raw_urls),
                )
                if known not in self.runtime.known:
                    self.runtime.known = [
                        *(k for k in self.runtime.known if _key(k.spec) != _key(spec)),
                        known,
                    ]
                    try:
                        runtime.save(self.config.data_dir, self.runtime)
                    except OSError as error:
                        log.warning("federation: cannot remember %s: %s", spec, error)
        if self._on_event is not None:
            self._on_event(name, record)

    def _drop_shadowed(self) -> None:
        """What the config now holds itself (an upstream of the same name, the same link)
        is the config's: the run-time copy is dropped."""
        federation = self.config.federation
        configured = {u.name for u in federation.upstreams}
        links = {_key(e) for e in federation.exchanges}
        shadowed = [e for e in self.runtime.exchanges if _key(e) in links]
        shadowed_upstreams = [name for name in self.runtime.upstreams if name in configured]
        if not shadowed and not shadowed_upstreams:
            return
        for exchange in shadowed:
            log.warning(
                "federation: %s is in the config file now; its run-time copy goes", exchange
            )
            self.runtime.exchanges.remove(exchange)
        for name in shadowed_upstreams:
            log.warning(
                "federation: upstream %r is in the config file now: its URLs are used", name
            )
            del self.runtime.upstreams[name]
        runtime.save(self.config.data_dir, self.runtime)

    def _urls(self, upstream: str) -> tuple[str, ...]:
        for configured in self.config.federation.upstreams:
            if configured.name == upstream:
                return configured.urls
        return self.runtime.upstreams[upstream].urls

    def _tls(self, upstream: str) -> ssl.SSLContext | None:
        """For amqps URLs: the upstream's own ``tls`` settings, else failover.peer_tls's,
        else None (the system's trust store)."""
        for configured in self.config.federation.upstreams:
            if configured.name == upstream and configured.tls is not None:
                prefix = f"federation.upstreams.{upstream}.tls"
                return client_context(configured.tls, self.config.source, prefix)
        return self.tls

    def _link(self, exchange: FederatedExchange, source: str, urls: tuple[str, ...] = ()) -> Link:
        federation = self.config.federation
        return Link(
            self.broker,
            exchange,
            urls or self._urls(exchange.upstream),
            self.name,
            self.id,
            federation.reconcile,
            federation.probe,
            federation.prefetch,
            self._link_event,
            tls=self._tls(exchange.upstream),
            source=source,
        )

    # -- leading -------------------------------------------------------------------------

    def set_leading(self, leading: bool) -> None:
        """Start the links (this server leads) or stop them (it follows)."""
        if leading == self.leading:
            return
        self.leading = leading
        previous = self._change
        self._change = asyncio.get_running_loop().create_task(self._apply(previous, leading))

    async def _apply(self, previous: asyncio.Task[None] | None, leading: bool) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        if leading:
            if self.links:
                log.info("federation: %s starts %d links", self.name, len(self.links))
            for link in self.links:
                link.start()
            self._retry_pending()
        elif self.links:
            log.info("federation: %s stops its links (it no longer leads)", self.name)
            await asyncio.gather(*(link.stop() for link in self.links), return_exceptions=True)

    async def close(self) -> None:
        self.leading = False
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._retry
        if self._change is not None:
            await asyncio.gather(self._change, return_exceptions=True)
        await asyncio.gather(*(link.stop() for link in self.links), return_exceptions=True)

    def status(self) -> list[dict[str, Any]]:
        """One dict per link (``Link.status``), with whether this server runs it."""
        return [{**link.status(), "active": self.leading} for link in self.links]

    def pending(self) -> list[dict[str, str]]:
        """The buffer queues still to delete upstream."""
        return [
            {"exchange": p.exchange, "vhost": p.vhost, "upstream": p.upstream, "queue": p.queue}
            for p in self.runtime.pending
        ]

    # -- at run time ---------------------------------------------------------------------

    def add(self, args: dict[str, Any]) -> dict[str, Any]:
        """Add a link (the console's ``federation add``), checked as the config's are; kept
        in ``federations.json`` and started at once if this server leads."""
        upstream_name = args.get("upstream")
        urls = args.get("urls")
        configured = [u.name for u in self.config.federation.upstreams]
        new_upstream: FederationUpstream | None = None
        try:
            if urls:
                if upstream_name in configured:
                    raise Refused(
                        "usage",
                        f"federation add: --url: upstream {upstream_name!r} is in the config "
                        "file: leave out --url (its URLs are used)",
                    )
                new_upstream = federation_upstream(
                    "console", "upstream", upstream_name, urls, urls_key="--url"
                )
                known = self.runtime.upstreams.get(new_upstream.name)
                if known is not None and known.urls != new_upstream.urls:
                    raise Refused(
                        "usage",
                        f"federation add: --url: upstream {upstream_name!r} was added with "
                        "other URLs: leave out --url, or remove its links first",
                    )
            upstreams = [*configured, *self.runtime.upstreams]
            if new_upstream is not None and new_upstream.name not in upstreams:
                upstreams.append(new_upstream.name)
            item = {k: args[k] for k in OPTIONS if args.get(k) is not None}
            spec = federated_exchange("console", "", item, upstreams)
        except ConfigError as error:
            refused = _bad_option(error)
            if error.key == "upstream" and "no upstream" in error.problem:
                refused.text += ": give its server URLs with --url"
            raise refused from None
        present = next((link for link in self.links if _key(link.spec) == _key(spec)), None)
        if present is not None:
            if present.source == "console" and present.spec == spec:
                return {**self._described(spec), "added": False, "unchanged": True}
            where = "in the config file" if present.source == "config" else "already, otherwise"
            raise Refused(
                "refused",
                f"exchange {spec.exchange!r} of vhost {spec.vhost!r} is linked to "
                f"{spec.upstream!r} {where}: remove it first",
            )
        kept = dict(self.runtime.upstreams)
        if new_upstream is not None:
            kept[new_upstream.name] = new_upstream
        self._commit(
            runtime.Runtime(
                kept,
                [*self.runtime.exchanges, spec],
                # A deletion still due of the same buffer queue would take the new link's.
                [p for p in self.runtime.pending if _key(p.spec) != _key(spec)],
            )
        )
        if not self.id:
            self.id = self.config.federation_id
        link = self._link(spec, "console")
        self.links.append(link)
        if self.leading:
            link.start()
        log.info("federation: link added at run time: %s", spec)
        return {**self._described(spec), "added": True, "running_here": self.leading}

    async def remove(self, args: dict[str, Any]) -> dict[str, Any]:
        """Remove a link added at run time (the console's ``federation remove``): stopped,
        forgotten, its buffer queue deleted upstream (or kept as a deletion to retry), a
        forwarding link's hidden queue removed once empty (or with ``drop_pending``)."""
        exchange = str(args["exchange"])
        upstream = str(args["upstream"])
        vhost = str(args.get("vhost") or "/")
        wanted = (exchange, vhost, upstream)
        link = next((link for link in self.links if _key(link.spec) == wanted), None)
        if link is None:
            raise Refused(
                "not_found",
                f"no link of exchange {exchange!r} of vhost {vhost!r} to {upstream!r} here",
            )
        if link.source != "console":
            raise Refused(
                "refused",
                f"exchange {exchange!r} of vhost {vhost!r} is linked to {upstream!r} by the "
                f"config file ({self.config.source}): edit the config to remove it",
            )
        spec = link.spec
        forward = names.forward_queue_name(spec.exchange, spec.upstream)
        local = self.broker.vhosts.get(spec.vhost)
        hidden = None if local is None or not spec.forward else local.hidden_queue(forward)
        holding = 0 if hidden is None else hidden.message_count + hidden.unacked
        if holding and self.leading and not args.get("drop_pending"):
            raise Refused(
                "refused",
                f"the link still holds {holding} messages to forward upstream (hidden queue "
                f"{forward!r}): wait until they are forwarded, or give --drop-pending",
            )
        queue = link.buffer_queue
        if args.get("buffer_queue") and str(args["buffer_queue"]).startswith(names.BUFFER_PREFIX):
            queue = str(args["buffer_queue"])  # the name the ACTIVE's link knew
        urls = self._urls(spec.upstream)
        exchanges = [e for e in self.runtime.exchanges if e != spec]
        upstreams = {
            name: u
            for name, u in self.runtime.upstreams.items()
            if any(e.upstream == name for e in exchanges)
        }
        pending = runtime.PendingDeletion(spec.exchange, spec.upstream, spec.vhost, queue, urls)
        due = [*self.runtime.pending, *(() if args.get("upstream_deleted") else (pending,))]
        self._commit(runtime.Runtime(upstreams, exchanges, due))
        self.links.remove(link)
        # Nothing is published into the hidden queue from here on.
        if hidden is not None and local is not None:
            local.remove_forward(spec.exchange, forward)
        await link.stop()
        dropped = 0
        if self.leading and hidden is not None and local is not None:
            dropped = local.remove_hidden_queue(forward)
        answer: dict[str, Any] = {
            **self._described(spec),
            "removed": True,
            "buffer_queue": queue,
            "forward_queue_removed": self.leading and hidden is not None,
            "dropped": dropped,
        }
        if not self.leading:
            # The ACTIVE deletes it; this server does when it leads, if still due.
            answer.update(upstream_deleted=bool(args.get("upstream_deleted")), pending=None)
        elif args.get("upstream_deleted"):
            answer.update(upstream_deleted=True, pending=None)
        else:
            problem = await self._delete(pending, urls)
            answer.update(upstream_deleted=problem is None, pending=problem)
            if problem is not None:
                self._retry_pending()
        log.info("federation: link removed at run time: %s (%s)", spec, answer)
        return answer

    def _commit(self, new: runtime.Runtime) -> None:
        """Write ``new`` and make it the run-time federations; refused (nothing changed)
        if it cannot be written."""
        try:
            runtime.save(self.config.data_dir, new)
        except OSError as error:
            raise Refused(
                "failed", f"cannot write {runtime.path_of(self.config.data_dir)}: {error}"
            ) from None
        self.runtime = new

    def _described(self, spec: FederatedExchange) -> dict[str, Any]:
        return {
            "exchange": spec.exchange,
            "vhost": spec.vhost,
            "upstream": spec.upstream,
            "bindings": spec.bindings,
            "forward": spec.forward,
            "max_hops": spec.max_hops,
            "delivery": spec.delivery,
        }

    # -- deletions still due ---------------------------------------------------------------

    async def _delete(self, pending: runtime.PendingDeletion, urls: tuple[str, ...]) -> str | None:
        """Delete a buffer queue upstream; None when done (and no longer due), else why
        not (it stays due)."""
        if not self.id:  # the delete proves the name too (docs/security.md)
            self.id = self.config.federation_id
        link = self._link(pending.spec, "console", urls)
        try:
            await link.delete_upstream_queue(pending.queue)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            reason = f"the upstream is unreachable ({error}); the deletion is retried"
            log.warning("federation: buffer queue %r not deleted: %s", pending.queue, reason)
            return reason
        if pending in self.runtime.pending:
            left = [p for p in self.runtime.pending if p != pending]
            with contextlib.suppress(Refused):  # kept due: tried again, harmlessly
                self._commit(runtime.Runtime(self.runtime.upstreams, self.runtime.exchanges, left))
        log.info("federation: buffer queue %r deleted upstream", pending.queue)
        return None

    def _retry_pending(self) -> None:
        if self.runtime.pending and (self._retry is None or self._retry.done()):
            self._retry = asyncio.get_running_loop().create_task(self._retrying())

    async def _retrying(self) -> None:
        while self.leading and self.runtime.pending:
            await asyncio.sleep(PENDING_RETRY)
            for pending in list(self.runtime.pending):
                if not self.leading:
                    return
                await self._delete(pending, pending.urls)
