"""The client helper's choice of the next server: redirects, NOT_ACTIVE closes, the list;
and what its failed attempts leave behind."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import warnings

import pytest

from amqha.client import ServerList, connect, redirect_target

BOUND = 10.0  # seconds a pure function may take before the test calls it hung


def target_within_bound(error: BaseException, redirects: list[str]) -> str | None:
    """redirect_target run on a thread: a loop that never ends fails the test, not the run."""
    found: list[str | None] = []
    thread = threading.Thread(target=lambda: found.append(redirect_target(error, redirects)))
    thread.daemon = True
    thread.start()
    thread.join(BOUND)
    assert not thread.is_alive(), "redirect_target did not return: it loops on the error chain"
    return found[0]


def cyclic(text: str) -> BaseException:
    """An error whose cause's context is the error itself, as a failed attempt can leave."""
    outer = ConnectionError(text)
    inner = OSError(111, "Connect call failed ('127.0.0.1', 1)")
    outer.__cause__ = inner
    inner.__context__ = outer
    return outer


def test_a_redirect_frame_wins_over_the_error() -> None:
    error = ConnectionError("NOT_ACTIVE - active server is 127.0.0.1:9")
    assert redirect_target(error, ["127.0.0.1:7", "127.0.0.1:8"]) == "127.0.0.1:8"


def test_the_not_active_text_is_found_down_the_chain() -> None:
    closed = ConnectionError("(320) NOT_ACTIVE - active server is [::1]:5673")
    error = RuntimeError("connection failed")
    error.__cause__ = closed
    assert redirect_target(error, []) == "[::1]:5673"


@pytest.mark.parametrize("text", ["connect call failed", "NOT_ACTIVE - active server is h:1"])
def test_an_error_chain_that_loops_ends(text: str) -> None:
    expected = "h:1" if "NOT_ACTIVE" in text else None
    assert target_within_bound(cyclic(text), []) == expected


def test_the_list_moves_on_after_a_failure_and_a_redirect_is_taken_once() -> None:
    servers = ServerList(["amqp://u:p@127.0.0.1:5672/", "amqp://u:p@127.0.0.1:5673/"])
    servers.failed(cyclic("refused"), [])
    assert servers.current().port == 5673
    servers.failed(None, ["127.0.0.1:5672"])  # told to go to the other one
    assert (servers.current().port, servers.current().user) == (5672, "u")
    servers.failed(None, ["127.0.0.1:5673"])  # a redirect that fails is not followed again
    assert servers.current().port == 5672


def test_after_a_loss_the_list_goes_on_from_the_server_lost() -> None:
    servers = ServerList(["amqp://u:p@127.0.0.1:5672/", "amqp://u:p@127.0.0.1:5673/"])
    servers.failed(None, ["127.0.0.1:5673"])  # the first listed redirected us to the second
    assert servers.current().port == 5673
    servers.lost(servers.current())  # it served, then was lost: not tried again first
    assert servers.current().port == 5672 and servers.redirected is None
    servers.lost(servers.current())
    assert servers.current().port == 5673
    handed_over = ConnectionError("(320) NOT_ACTIVE - active server is 127.0.0.1:5672")
    servers.lost(servers.current(), handed_over)  # closed by a handover: go where it says
    assert servers.current().port == 5672 and servers.redirected is not None


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one server"):
        ServerList([])


def test_failed_attempts_leave_no_connection_for_the_garbage_collector() -> None:
    """Each failed attempt's connection is closed before the next: one left open would
    schedule its close from the garbage collector, on whatever loop runs then (none here:
    a 'never awaited' warning)."""
    with socket.socket() as unused:  # a loopback port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    loop = asyncio.new_event_loop()
    try:
        failed = ""
        try:
            loop.run_until_complete(
                connect([f"amqp://guest:guest@127.0.0.1:{port}/"], retry_for=0.3, attempt_timeout=1)
            )
        except ConnectionError as error:  # not kept: its traceback would keep the attempts
            failed = str(error)
        assert "no ACTIVE server" in failed
        asyncio.set_event_loop(None)  # as between two tests: no current loop
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gc.collect()
        assert not [w for w in caught if "never awaited" in str(w.message)]
    finally:
        loop.close()
