"""amqps: a TLS listener beside the plain one, with aio-pika and pika, and bad certificates.

Certificates are made fresh by trustme (tests/certs.py). A client that does not trust the
server's certificate refuses it; with ``client_certs: required`` the server refuses a
client without a certificate, or with one from a CA it does not trust.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest

from tests.certs import Pki
from tests.support import free_port, start_to_exit


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Another CA: nothing it signs is trusted by the servers or clients of these tests."""
    return Pki(tmp_path_factory.mktemp("rogue"), "rogue")


def tls_server(make_server, pki: Pki, client_certs: str = "none"):
    port = free_port()
    server = make_server(f"tls-{client_certs}", tls=pki.listener(port, client_certs))
    server.tls_port = port
    server.start()
    assert f"amqps on 127.0.0.1:{port}" in server.log()
    return server


async def round_trip(port: int, context: ssl.SSLContext) -> bytes:
    connection = await aio_pika.connect(
        f"amqps://guest:guest@127.0.0.1:{port}/", ssl_context=context, timeout=10
    )
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        await channel.default_exchange.publish(aio_pika.Message(b"over tls"), queue.name)
        message = await queue.get(timeout=5)
        return message.body


def pika_tls(port: int, context: ssl.SSLContext) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            port,
            ssl_options=pika.SSLOptions(context, "127.0.0.1"),
            connection_attempts=1,
        )
    )


async def test_aio_pika_over_tls(make_server, pki: Pki) -> None:
    server = tls_server(make_server, pki)
    assert await round_trip(server.tls_port, pki.client_context()) == b"over tls"
    # The plain listener still serves.
    connection = await aio_pika.connect(server.url, timeout=10)
    await connection.close()


def test_pika_over_tls(make_server, pki: Pki) -> None:
    server = tls_server(make_server, pki)
    connection = pika_tls(server.tls_port, pki.client_context())
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"pika over tls")
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None and body == b"pika over tls"
    connection.close()


async def test_a_client_refuses_a_server_certificate_it_does_not_trust(
    make_server, pki: Pki, rogue: Pki
) -> None:
    server = tls_server(make_server, pki)
    with pytest.raises(aiormq.exceptions.AMQPConnectionError) as refused:
        await aiormq.connect(
            f"amqps://guest:guest@127.0.0.1:{server.tls_port}/", context=rogue.client_context()
        )
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    with pytest.raises(ssl.SSLCertVerificationError):
        pika_tls(server.tls_port, rogue.client_context())


async def test_plain_amqp_on_the_tls_port_is_refused(make_server, pki: Pki) -> None:
    server = tls_server(make_server, pki)
    with pytest.raises((aiormq.exceptions.AMQPConnectionError, ConnectionError, OSError)):
        await aiormq.connect(f"amqp://guest:guest@127.0.0.1:{server.tls_port}/")


async def test_required_client_certificates(make_server, pki: Pki, rogue: Pki) -> None:
    server = tls_server(make_server, pki, client_certs="required")
    assert await round_trip(server.tls_port, pki.client_context(with_cert=True)) == b"over tls"
    without_cert = pki.client_context()
    with pytest.raises((ssl.SSLError, ConnectionError, aiormq.exceptions.AMQPConnectionError)):
        await round_trip(server.tls_port, without_cert)
    # A certificate from a CA the server does not trust is refused too.
    rogue_cert = pki.client_context()
    rogue_cert.load_cert_chain(rogue.client_cert, rogue.client_key)
    with pytest.raises((ssl.SSLError, ConnectionError, aiormq.exceptions.AMQPConnectionError)):
        await round_trip(server.tls_port, rogue_cert)
    # The server still serves those that present a good one.
    assert await round_trip(server.tls_port, pki.client_context(with_cert=True)) == b"over tls"


async def test_optional_client_certificates(make_server, pki: Pki) -> None:
    server = tls_server(make_server, pki, client_certs="optional")
    assert await round_trip(server.tls_port, pki.client_context()) == b"over tls"
    assert await round_trip(server.tls_port, pki.client_context(with_cert=True)) == b"over tls"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda pki, rogue: {"key": rogue.server_key}, "tls.key: "),
        (lambda pki, rogue: {"cert": pki.server_key}, "tls.cert: no PEM certificate"),
        (lambda pki, rogue: {"ca": pki.server_key}, "tls.ca: not a CA certificate file"),
        (lambda pki, rogue: {"cert": "/nonexistent/server.pem"}, "tls.cert: cannot read"),
    ],
    ids=["key of another cert", "key as cert", "key as ca", "missing cert"],
)
def test_a_bad_certificate_stops_the_server_at_start(
    tmp_path: Path, pki: Pki, rogue: Pki, change, expected: str
) -> None:
    import yaml

    tls = {**pki.listener(free_port(), "optional"), **change(pki, rogue)}
    config = tmp_path / "server.yaml"
    config.write_text(
        yaml.safe_dump({"users": [{"name": "guest", "password": "guest"}], "tls": tls})
    )
    result = start_to_exit(config)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"Error: bad configuration: {config}: {expected}"), (
        result.stderr
    )
    assert "Traceback" not in result.stderr
