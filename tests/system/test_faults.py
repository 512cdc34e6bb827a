"""Faults in the environment of a running job: the cache degrades, the job never fails."""

from __future__ import annotations

import shutil
import threading

from support import key_of

import kernelcache


def test_root_disappears_mid_run(tmp_path):
    root = tmp_path / "vanishing"
    cache = kernelcache.Cache(root, readonly_roots=())
    first = key_of("before")
    cache.get_or_create(first, "bin", lambda: (b"one", {}))
    shutil.rmtree(root)
    assert cache.get(first, "bin") is None
    again = cache.get_or_create(first, "bin", lambda: (b"one", {}))
    assert again.data == b"one" and again.source == "local"
    assert cache.get(first, "bin").data == b"one"


def test_root_removed_repeatedly_while_threads_work(tmp_path):
    """Threads building and reading while another thread keeps deleting the whole root."""
    root = tmp_path / "churn"
    cache = kernelcache.Cache(root, readonly_roots=(), lock_timeout=5)
    stop = threading.Event()
    failures: list[BaseException] = []

    def remover() -> None:
        while not stop.is_set():
            shutil.rmtree(root, ignore_errors=True)
            stop.wait(0.005)

    def worker(n: int) -> None:
        try:
            for i in range(200):
                key = key_of("churn", i % 10)
                art = cache.get_or_create(key, "bin", lambda i=i: (b"v%d" % (i % 10), {}))
                assert art.data == b"v%d" % (i % 10)
                got = cache.get(key, "bin")
                assert got is None or got.data == b"v%d" % (i % 10)
        except BaseException as e:  # collected and re-raised by the test below
            failures.append(e)

    threads = [threading.Thread(target=remover)] + [
        threading.Thread(target=worker, args=(n,)) for n in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join(timeout=120)
    stop.set()
    threads[0].join(timeout=10)
    assert failures == []
