"""The host label every writer uses, and warnings given once per process."""

from __future__ import annotations

import logging
import threading

from kernelcache import process


def test_host_label_keeps_hostnames_and_makes_anything_else_safe():
    assert process.host_label("node-01.cluster_a") == "node-01.cluster_a"
    assert process.host_label("a/b c:d") == "a_b_c_d"
    assert len(process.host_label("x" * 200)) == 64
    assert process.host_label("") == "_"
    assert process.HOST == process.host_label(process.socket.gethostname())


def test_warn_once_logs_one_warning_across_threads(caplog):
    key = ("test", object())
    barrier = threading.Barrier(8)
    firsts: list[bool] = []
    log = logging.getLogger("kernelcache.test_process")

    def race() -> None:
        barrier.wait()
        firsts.append(process.warn_once(log, key, "said %s", "once"))

    with caplog.at_level(logging.WARNING, logger=log.name):
        threads = [threading.Thread(target=race) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(firsts) == [False] * 7 + [True]
    assert [r.getMessage() for r in caplog.records] == ["said once"]
    assert process.warn_once(log, ("another", "key"), "x") is True
