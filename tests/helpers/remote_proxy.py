"""A slow server made of a real one: a TCP proxy, in a process of its own, in front of a real
redis-server or S3 server (moto) that holds each request ``delay`` seconds before passing it
on, so that every answer comes just inside the client's timeout. The answers are the real
server's, unchanged.

A request is what the client sends once the server has answered its previous one (or on a new
connection): its first bytes are held ``delay`` seconds, the rest of it passes at once, and the
answer passes at once. So a request-and-answer protocol (Redis's RESP, HTTP/1.1) sees each
request answered ``delay`` seconds late, whatever its size.

``python remote_proxy.py TARGET_PORT DELAY`` prints its own port, then serves until killed;
:func:`slow_proxy` runs it for a block and yields that port.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path


def _pipe(client: socket.socket, target_port: int, delay: float) -> None:
    """Carry one connection both ways, holding each request's first bytes ``delay`` s."""
    with contextlib.suppress(OSError), client:
        server = socket.create_connection(("127.0.0.1", target_port))
        with server:
            selector = selectors.DefaultSelector()
            selector.register(client, selectors.EVENT_READ)
            selector.register(server, selectors.EVENT_READ)
            answering = False  # the server has begun to answer the last request
            fresh = True  # the next bytes of the client start a request
            while True:
                for ready, _ in selector.select():
                    sock = ready.fileobj
                    data = sock.recv(1 << 20)  # type: ignore[union-attr]
                    if not data:
                        return
                    if sock is client:
                        if fresh or answering:
                            time.sleep(delay)
                            fresh, answering = False, False
                        server.sendall(data)
                    else:
                        answering = True
                        client.sendall(data)


def serve(target_port: int, delay: float) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    print(listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_pipe, args=(conn, target_port, delay), daemon=True).start()


@contextlib.contextmanager
def slow_proxy(target_port: int, delay: float) -> Iterator[int]:
    """The port of a proxy process in front of ``127.0.0.1:target_port`` that answers each
    request ``delay`` seconds late (ended after the block)."""
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), str(target_port), str(delay)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield port
    finally:
        process.kill()
        process.wait(timeout=10)


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]))
