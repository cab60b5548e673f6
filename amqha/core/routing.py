"""Exchanges and routing: which destinations a routing key (and headers) reach.

Owns: the four exchange types (direct, fanout, topic, headers), their bindings and
matching, including the topic wildcards `*` (one word) and `#` (zero or more words), and
the deduplicating fanout (``x-message-deduplication``: its cache is ``core.dedup``'s, its
check the vhost's, before routing).
A destination is anything hashable — the vhost binds queues and exchanges.

Must not know: queues' contents, connections, the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from .dedup import EXCHANGE_TYPE as DEDUP_EXCHANGE
from .dedup import SeenCache, exchange_settings

HeadersFn = Callable[[], dict[str, Any]]

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers", DEDUP_EXCHANGE)


# The argument naming an exchange's alternate exchange (RabbitMQ's).
ALTERNATE_EXCHANGE = "alternate-exchange"

# What one argument item is counted as beyond its text: the Python objects that hold it.
ARGUMENT_ITEM_OVERHEAD = 64


def arguments_size(value: Any) -> int:
    """The bytes an arguments table (or a value in one) is counted as: its text and
    binary lengths (non-ASCII text at 4 bytes a character) plus ARGUMENT_ITEM_OVERHEAD
    for each key and value. Linear in the table; nothing is copied."""
    if isinstance(value, str):
        return ARGUMENT_ITEM_OVERHEAD + (len(value) if value.isascii() else 4 * len(value))
    if isinstance(value, bytes | bytearray):
        return ARGUMENT_ITEM_OVERHEAD + len(value)
    if isinstance(value, dict):
        return ARGUMENT_ITEM_OVERHEAD + sum(
            arguments_size(key) + arguments_size(item) for key, item in value.items()
        )
    if isinstance(value, list | tuple):
        return ARGUMENT_ITEM_OVERHEAD + sum(arguments_size(item) for item in value)
    return ARGUMENT_ITEM_OVERHEAD


def _count_up(counts: dict[Hashable, int], destination: Hashable) -> None:
    """One more binding to ``destination`` (an index counts them: equal bindings with
    other arguments route once)."""
    counts[destination] = counts.get(destination, 0) + 1


def _count_down(counts: dict[Hashable, int], destination: Hashable) -> bool:
    """One binding fewer to ``destination``; True if that was its last."""
    left = counts[destination] - 1
    if left:
        counts[destination] = left
        return False
    del counts[destination]
    return True


class ArgumentBytes:
    """The argument bytes (``arguments_size``) held by every live binding, exchange and
    queue of this process, and each binding's own cost (``BINDING_COST`` and its routing
    key): each adds its own when made and takes them back in its finaliser, as messages
    do in ``message.HELD``. The memory watermark reads it."""

    held = 0


# What one binding holds beyond its arguments: the binding, its key in the exchange's
# table and its entries in the routing index (tracemalloc over 50,000 bindings: 440 B on
# a fanout or headers exchange, 705 B on a direct one, 1,169 B on a topic one with a
# path of its own), plus its routing key's length. 400,000 bindings used to hold 370 MB
# that nothing counted.
BINDING_COST = 1024


def _frozen(value: Any) -> Hashable:
    """A hashable stand-in for an argument value that shares its text instead of copying
    it; the type is kept, so 1, True and 1.0 stay different bindings."""
    if isinstance(value, dict):
        return ("table", tuple(sorted((key, _frozen(item)) for key, item in value.items())))
    if isinstance(value, list | tuple):
        return ("array", tuple(_frozen(item) for item in value))
    if isinstance(value, bytearray):
        return ("bytes", bytes(value))
    return (type(value).__name__, value)


def binding_key(destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> tuple:
    return (id(destination), routing_key, _frozen(arguments))


class Binding:
    """One binding; it counts in ``ArgumentBytes`` while it lives."""

    __slots__ = ("destination", "routing_key", "arguments", "size")

    def __init__(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]):
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = arguments
        self.size = (
            BINDING_COST + len(routing_key) + (arguments_size(arguments) if arguments else 0)
        )
        ArgumentBytes.held += self.size

    def __del__(self) -> None:
        ArgumentBytes.held -= self.size


class Exchange:
    """An exchange's identity and bindings; subclasses say how keys match.

    Lookup structures change with each binding added or removed (``_added``,
    ``_removed``), never by a walk of all bindings: a bind costs the same with 20,000
    bindings as with one."""

    kind = ""
    # Only users with this tag may publish here (amq.peer: peering, amq.console: administrator).
    publish_tag: str | None = None
    # A control-plane exchange: outside the routing graph (see ControlExchange).
    control = False
    # The cache of a deduplicating exchange (DedupExchange).
    dedup: SeenCache | None = None

    def __init__(
        self,
        name: str,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.arguments_size = arguments_size(arguments) if arguments else 0
        ArgumentBytes.held += self.arguments_size
        self.bindings: dict[tuple, Binding] = {}
        # The same bindings by destination, so that a deleted queue's go in its own time.
        self.by_destination: dict[Hashable, dict[tuple, Binding]] = {}
        # Bindings whose destination is an exchange.
        self.exchange_bindings = 0
        # Counts every change of ``bindings``: a federation link compares it to see
        # whether the bindings it propagates changed (docs/federation.md, "The link"),
        # and is woken by a call of each of ``watchers`` when they do.
        self.version = 0
        self.watchers: set[Callable[[], None]] = set()

    def __del__(self) -> None:
        ArgumentBytes.held -= self.arguments_size

    def bind(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> bool:
        """Add a binding; False if the same binding exists already (binding is idempotent)."""
        key = binding_key(destination, routing_key, arguments)
        if key in self.bindings:
            return False
        binding = Binding(destination, routing_key, arguments)
        self.validate(binding)
        self.bindings[key] = binding
        self.by_destination.setdefault(destination, {})[key] = binding
        if isinstance(destination, Exchange):
            self.exchange_bindings += 1
        self._added(binding)
        self.version += 1
        if self.watchers:
            self._notify()
        return True

    def unbind(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> bool:
        key = binding_key(destination, routing_key, arguments)
        binding = self.bindings.pop(key, None)
        if binding is None:
            return False
        same = self.by_destination[destination]
        del same[key]
        if not same:
            del self.by_destination[destination]
        self._forget(binding)
        return True

    def unbind_destination(self, destination: Hashable) -> int:
        """Remove every binding to ``destination`` (it is being deleted)."""
        found = self.by_destination.pop(destination, None)
        if not found:
            return 0
        for key, binding in found.items():
            del self.bindings[key]
            self._forget(binding)
        return len(found)

    def _notify(self) -> None:
        for watcher in tuple(self.watchers):
            watcher()

    def _forget(self, binding: Binding) -> None:
        self.version += 1
        if self.watchers:
            self._notify()
        if isinstance(binding.destination, Exchange):
            self.exchange_bindings -= 1
        self._removed(binding)

    def validate(self, binding: Binding) -> None:
        """Raise ValueError for a binding this type cannot hold."""

    def _added(self, binding: Binding) -> None:
        """Update lookup structures for a new binding."""

    def _removed(self, binding: Binding) -> None:
        """Update lookup structures for a binding gone."""

    def route(self, routing_key: str, headers: HeadersFn) -> tuple:
        raise NotImplementedError


class DirectExchange(Exchange):
    """Destinations by routing key, each with how many bindings lead to it (bindings
    differing in arguments alone reach it once); the tuple a route returns is made on
    the first route after a change of that key."""

    kind = "direct"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._counts: dict[str, dict[Hashable, int]] = {}
        self._index: dict[str, tuple] = {}
        super().__init__(*args, **kwargs)

    def _added(self, binding: Binding) -> None:
        key = binding.routing_key
        counts = self._counts.setdefault(key, {})
        _count_up(counts, binding.destination)
        self._index.pop(key, None)

    def _removed(self, binding: Binding) -> None:
        key = binding.routing_key
        counts = self._counts[key]
        if _count_down(counts, binding.destination) and not counts:
            del self._counts[key]
        self._index.pop(key, None)

    def route(self, routing_key: str, headers: HeadersFn) -> tuple:
        found = self._index.get(routing_key)
        if found is None:
            counts = self._counts.get(routing_key)
            if counts is None:
                return ()
            found = self._index[routing_key] = tuple(counts)
        return found

    def index(self) -> dict[str, set]:
        """Routing key → destinations (for tests: it must equal what the bindings say)."""
        return {key: set(counts) for key, counts in self._counts.items()}


class FanoutExchange(Exchange):
    kind = "fanout"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._counts: dict[Hashable, int] = {}
        self._all: tuple | None = ()
        super().__init__(*args, **kwargs)

    def _added(self, binding: Binding) -> None:
        _count_up(self._counts, binding.destination)
        self._all = None

    def _removed(self, binding: Binding) -> None:
        _count_down(self._counts, binding.destination)
        self._all = None

    def route(self, routing_key: str, headers: HeadersFn) -> tuple:
        found = self._all
        if found is None:
            found = self._all = tuple(self._counts)
        return found

    def index(self) -> dict[str, set]:
        return {"": set(self._counts)} if self._counts else {}


class DedupExchange(FanoutExchange):
    """``x-message-deduplication``: a fanout (as in the plugin, routing keys are not
    matched) whose cache of ``x-deduplication-header`` values drops a copy before it is
    routed (``VHost.route``). A wrong argument refuses the declare (a 406)."""

    kind = DEDUP_EXCHANGE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dedup = SeenCache(exchange_settings(self.name, self.arguments))


def alternate_of(exchange: Exchange, exchanges: dict[str, Exchange]) -> list[Exchange]:
    """RabbitMQ's rule: an exchange with no destination for a message hands it to its
    alternate exchange (if that exists), which may hand it on to its own."""
    name = exchange.arguments.get(ALTERNATE_EXCHANGE)
    alternate = exchanges.get(name) if isinstance(name, str) else None
    if alternate is None or alternate.control:
        return []
    return [alternate]


def topic_matches(pattern: str, routing_key: str) -> bool:
    """AMQP topic matching: words split on '.', `*` is one word, `#` is zero or more."""
    return _match_words(pattern.split("."), 0, routing_key.split("."), 0)


def _match_words(pattern: list[str], p: int, words: list[str], w: int) -> bool:
    while p < len(pattern):
        token = pattern[p]
        if token == "#":
            # Collapse runs of '#', then try every split point for what it swallows.
            while p + 1 < len(pattern) and pattern[p + 1] == "#":
                p += 1
            if p + 1 == len(pattern):
                return True
            return any(_match_words(pattern, p + 1, words, k) for k in range(w, len(words) + 1))
        if w >= len(words):
            return False
        if token != "*" and token != words[w]:
            return False
        p += 1
        w += 1
    return w == len(words)


class _TopicNode:
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode] = {}
        # Destination → how many bindings end here for it.
        self.destinations: dict[Hashable, int] = {}


class TopicExchange(Exchange):
    """Bindings live in a trie of words; results are cached per routing key.

    A binding adds or removes its own path (empty nodes pruned). The cache is cleared
    whenever bindings change and capped in size, so a stream of distinct keys costs a
    trie walk each, never unbounded memory.
    """

    kind = "topic"
    CACHE_LIMIT = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._root = _TopicNode()
        self._cache: dict[str, tuple] = {}
        super().__init__(*args, **kwargs)

    def _added(self, binding: Binding) -> None:
        node = self._root
        for word in binding.routing_key.split("."):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _TopicNode()
            node = child
        _count_up(node.destinations, binding.destination)
        if self._cache:
            self._cache = {}

    def _removed(self, binding: Binding) -> None:
        path = [self._root]
        words = binding.routing_key.split(".")
        for word in words:
            path.append(path[-1].children[word])
        node = path[-1]
        _count_down(node.destinations, binding.destination)
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.children or node.destinations:
                break
            del path[depth - 1].children[words[depth - 1]]
        if self._cache:
            self._cache = {}

    def route(self, routing_key: str, headers: HeadersFn) -> tuple:
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        found: dict = {}
        _walk(self._root, routing_key.split("."), 0, found)
        result = tuple(found)
        if len(self._cache) >= self.CACHE_LIMIT:
            self._cache.clear()
        self._cache[routing_key] = result
        return result

    def index(self) -> dict[str, set]:
        """Pattern → destinations, read back from the trie (for tests)."""
        found: dict[str, set] = {}

        def visit(node: _TopicNode, words: list[str]) -> None:
            if node.destinations:
                found[".".join(words)] = set(node.destinations)
            for word, child in node.children.items():
                visit(child, [*words, word])

        for word, child in self._root.children.items():
            visit(child, [word])
        return found


def _walk(node: _TopicNode, words: list[str], at: int, found: dict) -> None:
    hash_node = node.children.get("#")
    if hash_node is not None:
        # '#' may swallow zero or more of the remaining words.
        for k in range(at, len(words) + 1):
            _walk(hash_node, words, k, found)
    if at == len(words):
        for destination in node.destinations:
            found[destination] = None
        return
    word = words[at]
    exact = node.children.get(word)
    if exact is not None:
        _walk(exact, words, at + 1, found)
    star = node.children.get("*")
    if star is not None:
        _walk(star, words, at + 1, found)


def headers_match(binding_arguments: dict[str, Any], headers: dict[str, Any]) -> bool:
    """x-match all (default) / any, and the -with-x variants that also compare x- keys."""
    mode = binding_arguments.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode()
    with_x = mode.endswith("-with-x")
    wanted = {
        k: v
        for k, v in binding_arguments.items()
        if k != "x-match" and (with_x or not k.startswith("x-"))
    }
    if mode.startswith("any"):
        return any(_header_equal(headers, k, v) for k, v in wanted.items())
    return all(_header_equal(headers, k, v) for k, v in wanted.items())


def _header_equal(headers: dict[str, Any], key: str, value: Any) -> bool:
    if key not in headers:
        return False
    # A binding argument with no value (void) matches on presence alone.
    return value is None or headers[key] == value


class HeadersExchange(Exchange):
    kind = "headers"

    def validate(self, binding: Binding) -> None:
        mode = binding.arguments.get("x-match", "all")
        if isinstance(mode, bytes):
            mode = mode.decode()
        if mode not in ("all", "any", "all-with-x", "any-with-x"):
            raise ValueError(f"invalid x-match value '{mode}'")

    def route(self, routing_key: str, headers: HeadersFn) -> tuple:
        if not self.bindings:
            return ()
        message_headers = headers()
        found: dict = {}
        for binding in self.bindings.values():
            if headers_match(binding.arguments, message_headers):
                found[binding.destination] = None
        return tuple(found)


class ControlExchange(Exchange):
    """An exchange of the server's control plane (amq.peer, amq.console).

    It is not part of the routing graph: nothing is bound to it or from it, nothing is
    routed through it, and no queue holds what is published to it. A publish by a user
    tagged ``publish_tag`` goes straight to ``receiver`` with the name of the user the
    connection authenticated as, never a property the publisher set. With no receiver
    (a vhost the server does not listen on) a publish reaches nothing.
    See docs/security.md ("The control plane").
    """

    control = True

    def __init__(self, name: str, kind: str, publish_tag: str) -> None:
        super().__init__(name, durable=True)
        self.kind = kind  # what a passive declare compares; it never routes
        self.publish_tag = publish_tag
        self.receiver: Callable[[Any, str], None] | None = None

    def validate(self, binding: Binding) -> None:
        raise ValueError(f"exchange '{self.name}' belongs to the server's control plane")

    def route(self, routing_key: str, headers: HeadersFn) -> tuple:
        return ()


EXCHANGE_CLASSES: dict[str, type[Exchange]] = {
    "direct": DirectExchange,
    "fanout": FanoutExchange,
    "topic": TopicExchange,
    "headers": HeadersExchange,
    DEDUP_EXCHANGE: DedupExchange,
}
