"""Importing a bundle into a root, all or nothing.

A first pass reads and checks the whole bundle without writing anything
(:mod:`kernelcache.bundle.preflight`; members whose extension has a structure to check are read
again for the contract of an entry); ``dry_run`` stops there, with the same outcome. Only then
does a second pass publish each entry through :meth:`Store.publish` (atomic, first writer
wins), re-checking each member's digest first; entries already present are skipped. Each
document is published as written (its fields, ``covers`` and entry digest; its signature is
dropped). If anything fails during that pass (the file changed, a full disk, Ctrl-C), the
entries this import published are deleted again before the error is raised. (A process killed during the
second pass cannot roll back: the entries it published are whole and verified.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import IO

from ..errors import BundleError, NotRegularFile, WrongExt
from ..fsio import load_json, open_regular
from ..schema.document import check_signature
from ..store.entry import Artifact
from ..store.root import Store
from ..toolchains import Judge
from .archive import MANIFEST, MAX_MEMBER_BYTES, ImportResult, Progress
from .manifest_reader import Listed
from .preflight import check_artifacts, tar_members


def _open_bundle(path: str) -> IO[bytes]:
    """``path`` opened for reading, if it is a regular file (a FIFO or device is refused
    without blocking on it)."""
    try:
        return open_regular(path)
    except NotRegularFile:
        raise BundleError(f"{path} is not a regular file") from None
    except OSError as e:
        raise BundleError(f"cannot open {path}: {e.strerror}") from e


def _roll_back(store: Store, keys: Sequence[str]) -> int:
    """Delete the entries an import published; return how many could not be deleted."""
    left = 0
    for key in keys:
        try:
            if store.delete(key, wait=store.lock_timeout) is None:
                left += 1
        except (OSError, ValueError):
            left += 1
    return left


def import_bundle(
    store: Store,
    path: str,
    *,
    max_member_size: int = MAX_MEMBER_BYTES,
    dry_run: bool = False,
    progress: Progress | None = None,
    signing_key: bytes | None = None,
    judge: Judge | None = None,
    planned: Progress | None = None,
) -> ImportResult:
    """Verify the bundle ``path`` completely, then publish its entries into ``store``.

    With ``dry_run`` only the verification runs (the same as for a real import: what it
    accepts, the import publishes). Entries whose key is already present (and valid, under
    the store's trust policy) are skipped; a key present with another extension is a conflict,
    left alone. An artifact larger than ``max_member_size`` bytes rejects the bundle (0: no
    limit). With ``signing_key``, every entry must carry a valid signature. With ``judge``
    (see :mod:`kernelcache.toolchains`), the result counts the entries this machine's keys can
    name, and the others by reason. Once the bundle is verified, ``planned`` is called with
    the number of entries to publish, and ``progress`` with 1 as each is published.

    Raises:
        BundleError: the bundle is rejected, or changed while being imported; nothing was
            written (``imported`` counts entries that could not be removed again, normally 0).
        MissingDependency: a zstd bundle and no ``zstandard``.
        CacheError: the store cannot take an entry (read-only root, full disk, ...); the
            entries this import published before are removed again.
        KeyboardInterrupt: Ctrl-C; while it published, the entries it published are removed
            again first (its ``rolled_back``: how many it had published, and how many of
            them could not be removed).
    """
    with _open_bundle(path) as f:
        members = {
            m.name: m
            for m in tar_members(
                f,
                max_member_size,
                keep_data=False,
                sha256=signing_key is not None,
                read_manifest=True,
            )
        }
        manifest = members.pop(MANIFEST, None)
        if manifest is None or manifest.manifest is None:
            raise BundleError(f"bad manifest: the bundle has no {MANIFEST}")
        listed, compat = manifest.manifest.entries, manifest.manifest.fields["compatibility"]
        lacking = sorted(listed.keys() - members.keys())
        if lacking:
            raise BundleError(f"bad manifest: it lists {lacking[0]!r}, which the bundle lacks")
        unlisted = sorted(members.keys() - listed.keys())
        if unlisted:
            raise BundleError(f"member {unlisted[0]!r} is not listed in the manifest")
        for name, member in sorted(members.items()):
            entry = listed[name]
            if member.size != entry.size or member.digest != entry.digest:
                raise BundleError(
                    f"member {name!r} does not match the manifest (size {member.size} vs "
                    f"{entry.size}, digest {member.digest} vs {entry.digest}): the bundle "
                    "is corrupt or was tampered with"
                )
            if signing_key is not None:
                assert member.sha256 is not None
                why = check_signature(load_json(entry.text), member.sha256, signing_key)
                if why is not None:
                    raise BundleError(
                        f"entry {entry.key} is refused: {why} (KERNELCACHE_SIGNING_KEY is "
                        "set: only bundles signed with it are imported)"
                    )
        check_artifacts(f, listed, max_member_size)
        checker = Store(store.root, readonly=True, trust=store.trust, resolved=True)
        present = 0
        conflicts: list[tuple[str, str]] = []
        todo = []
        for name, entry in sorted(listed.items()):
            existing = checker.read(entry.key)
            if isinstance(existing, Artifact):
                if existing.ext == entry.ext:
                    present += 1
                else:
                    conflicts.append((entry.key, f"holds a .{existing.ext} artifact"))
                continue
            todo.append(name)
        looked_up, reasons = _judged(listed.values(), judge)
        if dry_run or not todo:
            size = sum(listed[n].size for n in todo)
            return ImportResult(
                path,
                len(listed),
                len(todo),
                present,
                size,
                tuple(conflicts),
                compat,
                dry_run,
                looked_up,
                reasons,
            )
        wanted = set(todo)
        published: list[str] = []
        imported = 0
        size = 0
        if planned is not None:
            planned(len(todo))
        try:
            for member in tar_members(
                f, max_member_size, keep_data=True, sha256=signing_key is not None
            ):
                if member.name not in wanted:
                    continue
                entry = listed[member.name]
                original = members[member.name]
                if (
                    member.digest != entry.digest
                    or member.data is None
                    or member.sha256 != original.sha256
                ):
                    raise BundleError(
                        f"{path} changed while being imported (member {member.name!r})"
                    )
                published.append(
                    member.key
                )  # (first: Ctrl-C right after its publish rolls it back)
                try:
                    _, created = store.publish(
                        member.key, member.ext, member.data, entry.document(), as_written=True
                    )
                except WrongExt as e:
                    published.pop()
                    conflicts.append((member.key, str(e)))
                    continue
                except Exception:  # (not published: nothing of it to roll back)
                    published.pop()
                    raise
                if not created:
                    published.pop()
                imported += 1
                size += member.size
                if progress is not None:
                    progress(1)
        except BaseException as e:
            left = _roll_back(store, published)
            if isinstance(e, BundleError):
                e.imported = left
            if isinstance(e, KeyboardInterrupt):
                e.rolled_back = (len(published), left)  # type: ignore[attr-defined]
            raise
    return ImportResult(
        path,
        len(listed),
        imported,
        present,
        size,
        tuple(conflicts),
        compat,
        False,
        looked_up,
        reasons,
    )


def _judged(
    entries: Iterable[Listed], judge: Judge | None
) -> tuple[int | None, tuple[tuple[str, int], ...]]:
    """How many of ``entries`` ``judge`` says this machine would look up, and the others by
    reason, most frequent first (None and nothing without a judge). A companion of an entry
    of the bundle (its ``of`` names that entry's key) is looked up with it: it shares its
    verdict."""
    if judge is None:
        return None, ()
    entries = list(entries)
    keys = {entry.key for entry in entries}
    verdicts: dict[str, str | None] = {}
    companions: dict[str, str] = {}  # one document parsed at a time: a manifest may be large
    for entry in entries:
        doc = load_json(entry.text)
        of = doc.get("of")
        if isinstance(of, str) and of in keys:
            companions[entry.key] = of
        else:
            verdicts[entry.key] = judge(doc)
    reasons: Counter[str] = Counter()
    looked_up = 0
    for entry in entries:
        why = verdicts[entry.key] if entry.key in verdicts else verdicts[companions[entry.key]]
        if why is None:
            looked_up += 1
        else:
            reasons[why] += 1
    return looked_up, tuple(reasons.most_common())
