"""A caller's own check of a remote entry (``BuildItem.accept``), against a real redis-server:
an entry it refuses is a miss, said once and counted as untrusted at each read, built here
instead, and no copy of it is written to the local root; one it accepts is published and served
as always."""

from __future__ import annotations

import logging

import pytest
from artifact_images import elf_image, launch
from redis_server import REDIS_SERVER, SKIP_REASON

import bridge.entries.metadata  # noqa: F401 -- its launch fields (num_warps, ...) are covered by the digest
import kernelcache
from kernelcache import BuildItem

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)

KEY = "c3" * 32
THEIRS = elf_image(b"theirs" * 700)
OURS = elf_image(b"ours" * 700)


def _publish(server, tmp_path) -> None:
    """Another machine's entry ``KEY``, in the tier only."""
    other = kernelcache.Cache(tmp_path / "other", readonly_roots=(), remote=server.url)
    other.put(KEY, "cubin", THEIRS, launch())


def _fetch(server, root, accept) -> tuple[bytes, list[str]]:
    cache = kernelcache.Cache(root, readonly_roots=(), remote=server.url)
    built: list[str] = []

    def build():
        built.append(KEY)
        return OURS, launch()

    (art,) = cache.get_or_create_many([BuildItem(KEY, "cubin", build, accept)])
    return art.data, built


def _holding(root, data: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and data in p.read_bytes()]


def test_a_refused_remote_entry_is_built_here_and_never_copied(server, tmp_path, caplog):
    _publish(server, tmp_path)
    root = tmp_path / "victim"
    seen = []

    def refuse(art: kernelcache.Artifact) -> str:
        seen.append(art.data)
        return "not ours"

    caplog.set_level(logging.WARNING, logger="kernelcache")
    before = kernelcache.process_stats()["untrusted"]
    data, built = _fetch(server, root, refuse)
    # the check saw the remote bytes, whole, at each read of them (the lookup, then the look
    # again under the build lock)
    assert seen and set(seen) == {THEIRS}
    assert (data, built) == (OURS, [KEY])
    assert _holding(root, THEIRS) == [] and _holding(root, OURS) != []
    said = [r.getMessage() for r in caplog.records if "refused the remote entry" in r.getMessage()]
    assert len(said) == 1 and KEY in said[0] and "not ours" in said[0]
    assert kernelcache.process_stats()["untrusted"] == before + len(seen)  # one per read


def test_an_accepted_remote_entry_is_published_and_served(server, tmp_path):
    _publish(server, tmp_path)
    root = tmp_path / "reader"
    data, built = _fetch(server, root, lambda art: None)
    assert (data, built) == (THEIRS, [])
    assert _holding(root, THEIRS) != []


def test_a_check_that_raises_refuses_the_entry(server, tmp_path, caplog):
    """The caller's check fails on the bytes it was given: the lookup still never raises, and
    what it could not judge is not copied."""
    _publish(server, tmp_path)
    root = tmp_path / "victim"

    def broken(art: kernelcache.Artifact) -> str | None:
        raise ValueError("cannot parse this")

    caplog.set_level(logging.WARNING, logger="kernelcache")
    data, built = _fetch(server, root, broken)
    assert (data, built) == (OURS, [KEY])
    assert _holding(root, THEIRS) == []
    said = [r.getMessage() for r in caplog.records if "refused the remote entry" in r.getMessage()]
    assert len(said) == 1 and "cannot parse this" in said[0]


def test_get_judges_a_remote_entry_at_its_door(server, tmp_path):
    """``Cache.get`` takes the caller's check too: refused, the entry is a miss and no copy
    is made; accepted, it is published as always."""
    _publish(server, tmp_path)
    root = tmp_path / "reader"
    cache = kernelcache.Cache(root, readonly_roots=(), remote=server.url)
    assert cache.get(KEY, "cubin", accept=lambda art: "not ours") is None
    assert _holding(root, THEIRS) == []
    art = cache.get(KEY, "cubin", accept=lambda art: None)
    assert art is not None and art.data == THEIRS and art.path is not None
    assert _holding(root, THEIRS) == [art.path]


def test_a_remote_entry_read_without_a_copy_is_kept_when_asked(server, tmp_path):
    """``copy=False``: the entry is served from memory (no path) and nothing is written until
    the caller ``keep``s it; then it is the local entry, as its writer wrote it."""
    _publish(server, tmp_path)
    root = tmp_path / "reader"
    cache = kernelcache.Cache(root, readonly_roots=(), remote=server.url)
    art = cache.get(KEY, "cubin", copy=False)
    assert art is not None and art.data == THEIRS and art.path is None
    assert art.source == "remote" and _holding(root, THEIRS) == []
    kept = cache.keep(art)
    assert kept.path is not None and _holding(root, THEIRS) == [kept.path]
    local = kernelcache.Cache(root, readonly_roots=(), remote="").get(KEY, "cubin")
    assert local is not None and local.data == THEIRS
    assert local.meta["digest"] == art.meta["digest"]
    assert local.meta["created"] == art.meta["created"]  # (the writer's document, not widened)
