"""Exchanges and routing: which destinations a routing key (and headers) reach.

Owns: the four exchange types (direct, fanout, topic, headers), their bindings and
matching, including the topic wildcards `*` (one word) and `#` (zero or more words).
A destination is anything hashable — the vhost binds queues and exchanges.

Must not know: queues' contents, connections, the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

HeadersFn = Callable[[], dict[str, Any]]

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")


class Binding:
    __slots__ = ("destination", "routing_key", "arguments")

    def __init__(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]):
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = arguments

    def key(self) -> tuple[int, str, tuple[tuple[str, str], ...]]:
        return (
            id(self.destination),
            self.routing_key,
            tuple(sorted((k, repr(v)) for k, v in self.arguments.items())),
        )


class Exchange:
    """An exchange's identity and bindings; subclasses say how keys match."""

    kind = ""
    # Only users with this tag may publish here (amq.peer: peering, amq.console: administrator).
    publish_tag: str | None = None
    # A control-plane exchange: outside the routing graph (see ControlExchange).
    control = False

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
        self.bindings: dict[tuple, Binding] = {}

    def bind(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> bool:
        """Add a binding; False if the same binding exists already (binding is idempotent)."""
        binding = Binding(destination, routing_key, arguments)
        key = binding.key()
        if key in self.bindings:
            return False
        self.validate(binding)
        self.bindings[key] = binding
        self._rebuild()
        return True

    def unbind(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> bool:
        key = Binding(destination, routing_key, arguments).key()
        if self.bindings.pop(key, None) is None:
            return False
        self._rebuild()
        return True

    def unbind_destination(self, destination: Hashable) -> int:
        """Remove every binding to ``destination`` (it is being deleted)."""
        keys = [k for k, b in self.bindings.items() if b.destination is destination]
        for key in keys:
            del self.bindings[key]
        if keys:
            self._rebuild()
        return len(keys)

    def validate(self, binding: Binding) -> None:
        """Raise ValueError for a binding this type cannot hold."""

    def _rebuild(self) -> None:
        """Recompute lookup structures after the bindings changed."""

    def route(self, routing_key: str, headers: HeadersFn) -> tuple:
        raise NotImplementedError


class DirectExchange(Exchange):
    kind = "direct"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._index: dict[str, tuple] = {}
        super().__init__(*args, **kwargs)

    def _rebuild(self) -> None:
        index: dict[str, list] = {}
        for binding in self.bindings.values():
            targets = index.setdefault(binding.routing_key, [])
            if binding.destination not in targets:
                targets.append(binding.destination)
        self._index = {key: tuple(targets) for key, targets in index.items()}

    def route(self, routing_key: str, headers: HeadersFn) -> tuple:
        return self._index.get(routing_key, ())


class FanoutExchange(Exchange):
    kind = "fanout"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._all: tuple = ()
        super().__init__(*args, **kwargs)

    def _rebuild(self) -> None:
        self._all = tuple(dict.fromkeys(b.destination for b in self.bindings.values()))

    def route(self, routing_key: str, headers: HeadersFn) -> tuple:
        return self._all


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
        self.destinations: list = []


class TopicExchange(Exchange):
    """Bindings live in a trie of words; results are cached per routing key.

    The cache is cleared whenever bindings change and capped in size, so a stream of
    distinct keys costs a trie walk each, never unbounded memory.
    """

    kind = "topic"
    CACHE_LIMIT = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._root = _TopicNode()
        self._cache: dict[str, tuple] = {}
        super().__init__(*args, **kwargs)

    def _rebuild(self) -> None:
        root = _TopicNode()
        for binding in self.bindings.values():
            node = root
            for word in binding.routing_key.split("."):
                node = node.children.setdefault(word, _TopicNode())
            if binding.destination not in node.destinations:
                node.destinations.append(binding.destination)
        self._root = root
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
}
