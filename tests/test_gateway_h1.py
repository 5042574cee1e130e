"""The gateway's HTTP/1.1 upstream client on its own, against small raw servers: connection reuse, a server that
closed an idle connection, bodies without a length, gzip, flow control on big bodies, TLS, and every error kind."""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from rl_backend.gateway.h1client import ConnectError, H1Pool, HTTPError, NoResponse, ReadTimeout

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    return head + await reader.readexactly(length)


def _ok(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n" % (len(body), b"".join(e + b"\r\n" for e in extra)) + body


async def _serve(handler: Handler, **kwargs: object) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]
    return server, server.sockets[0].getsockname()[1]


async def _post(pool: H1Pool, url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    response = await pool.post(url, {"content-type": "application/json"}, b'{"x": 1}', timeout=timeout, connect_timeout=2)
    try:
        return response.status_code, await response.aread()
    finally:
        response.close()


def test_keep_alive_reuse_and_a_server_that_closed_the_idle_connection() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        served = 0
        while True:
            try:
                request = await _read_request(reader)
            except asyncio.IncompleteReadError:
                break
            assert request.startswith(b"POST /v1/x HTTP/1.1\r\nhost: 127.0.0.1:")
            if served == 2:  # the server had dropped this connection: it closes without an answer
                break
            served += 1
            writer.write(_ok(b'{"n": %d}' % served))
            await writer.drain()
        writer.close()

    async def main() -> list[tuple[int, bytes]]:
        server, port = await _serve(handler)
        pool = H1Pool()
        url = f"http://127.0.0.1:{port}/v1/x"
        results = [await _post(pool, url) for _ in range(4)]
        await pool.aclose()
        server.close()
        return results

    results = asyncio.run(main())
    # The third call hit the closed connection and went again on a new one, unseen by the caller.
    assert results == [(200, b'{"n": 1}'), (200, b'{"n": 2}'), (200, b'{"n": 1}'), (200, b'{"n": 2}')]
    assert connections == 2


def test_body_until_close_gzip_and_a_big_chunked_body() -> None:
    big = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB: reading pauses and resumes the socket

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        if b"/close" in request:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the ")
            await writer.drain()
            writer.write(b"end")
        elif b"/gzip" in request:
            writer.write(_ok(gzip.compress(b'{"zipped": true}'), b"content-encoding: gzip"))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for i in range(0, len(big), 65536):
                part = big[i:i + 65536]
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main() -> tuple[bytes, bytes, int]:
        server, port = await _serve(handler)
        pool = H1Pool()
        _, until_close = await _post(pool, f"http://127.0.0.1:{port}/close")
        _, unzipped = await _post(pool, f"http://127.0.0.1:{port}/gzip")
        response = await pool.post(f"http://127.0.0.1:{port}/big", {}, b"", timeout=5, connect_timeout=2)
        received = bytearray()
        async for chunk in response.aiter_bytes():
            received += chunk
            await asyncio.sleep(0)  # a slow reader
        response.close()
        await pool.aclose()
        server.close()
        return until_close, unzipped, len(received) if bytes(received) == big else -1

    assert asyncio.run(main()) == (b"until the end", b'{"zipped": true}', len(big))


def test_error_kinds() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        if b"/garbage" in request:
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        elif b"/hang-body" in request:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
            await writer.drain()
            await asyncio.sleep(1)
        elif b"/cut" in request:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        # /silent: close without a byte
        await writer.drain()
        writer.close()

    async def main() -> list[str]:
        server, port = await _serve(handler)
        pool = H1Pool()
        base = f"http://127.0.0.1:{port}"
        seen = []
        for path, timeout in (("/garbage", 5.0), ("/hang-body", 0.2), ("/cut", 5.0), ("/silent", 5.0)):
            try:
                await _post(pool, base + path, timeout)
            except HTTPError as exc:
                seen.append(type(exc).__name__)
        with pytest.raises(ConnectError):
            server.close()
            await server.wait_closed()
            await _post(pool, base + "/refused")
        await pool.aclose()
        return seen

    kinds = asyncio.run(main())
    assert kinds == ["HTTPError", ReadTimeout.__name__, "HTTPError", NoResponse.__name__]


def test_tls(tmp_path: Path) -> None:
    cryptography = pytest.importorskip("cryptography")
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    assert cryptography
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_file, key_file)
    client_ctx = ssl.create_default_context(cafile=str(cert_file))

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_ok(b'{"secure": true}'))
        await writer.drain()
        writer.close()

    async def main() -> tuple[tuple[int, bytes], str]:
        server, port = await _serve(handler, ssl=server_ctx)
        ok = await _post(H1Pool(ssl_context=client_ctx), f"https://localhost:{port}/v1")
        try:
            await _post(H1Pool(), f"https://localhost:{port}/v1")  # the system's CAs do not know this certificate
            refused = "no"
        except ConnectError as exc:
            refused = "CERTIFICATE_VERIFY_FAILED" if "CERTIFICATE_VERIFY_FAILED" in str(exc) else str(exc)
        server.close()
        return ok, refused

    assert asyncio.run(main()) == ((200, b'{"secure": true}'), "CERTIFICATE_VERIFY_FAILED")
