"""The usage file ``<root>/.stats/usage``: the running estimate of a root's size that every
process writing the root shares, and each process's view of it (:class:`UsageView`).

Accounting is cheap: a put that publishes an entry appends its bytes (artifact plus metadata)
as one record of :data:`RECORD` bytes, and reads the records others appended since its last
look. The first record is the root's size as the last eviction pass measured it, so the sum is
a running estimate of the root's size. (Deletes are not counted: ``kernelcache prune`` and
``clear`` remove the file, and the next put measures the root again.) It is never too low: a
pass that writes the file anew keeps the records appended since it began, and a put that finds
it appended to a file replaced meanwhile appends again.

The file is a hint that others can write: it decides when a pass runs, never what it deletes.
A process reads at most :data:`MAX_USAGE_READ` bytes of it at a look; a file with more unread,
or holding anything this module never writes there, is read no further (one warning per
process): the estimate is unknown, so a pass is due, and it writes the file anew. What a pass
measures and writes as the base is :func:`entries_of`: a listing of the root and the status of
each entry's files, no metadata read.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping

from ..errors import LockTimeout, LockUnavailable
from ..fsio import open_planted
from ..keys import KEY_PATTERN, META_EXT, all_keys, valid_ext
from ..process import warn_once
from ..store.layout import STATS_DIR, open_subdir, replace_file
from ..store.removal import remove_own_file
from ..store.root import Store
from ..table import EntryInfo

logger = logging.getLogger(__name__)

USAGE_NAME = "usage"
#: a record: one kind byte (``B`` the base a pass measured, ``+`` bytes a put added), the
#: number in 22 digits, a newline
RECORD = 24
#: a usage file larger than this is rewritten (two records) by the next process that reads it
MAX_USAGE_BYTES = 1 << 20
#: the most a process reads of the usage file at one look: more unread than this is not a file
#: this module keeps (it is compacted at :data:`MAX_USAGE_BYTES`), and is refused unread
MAX_USAGE_READ = 4 * MAX_USAGE_BYTES
#: the largest number a record may hold: no file, hence no entry and no root, is larger
MAX_RECORD = (1 << 63) - 1
#: the lock name under ``.locks/`` that eviction passes (and compacting the file) take
PASS_LOCK = "capacity"


def usage_record(kind: bytes, value: int) -> bytes:
    return kind + b"%22d\n" % max(0, min(value, MAX_RECORD))


def _parse(record: bytes, at: int) -> tuple[bytes, int] | None:
    """The kind and number of ``record`` (:data:`RECORD` bytes read at offset ``at`` of the
    usage file); None where it is not what this module writes there: a base anywhere but
    first, an addition of nothing, a number larger than :data:`MAX_RECORD`, any other kind or
    shape."""
    kind, digits = record[:1], record[1 : RECORD - 1].lstrip(b" ")
    if len(record) != RECORD or record[-1:] != b"\n" or not digits.isdigit():
        return None
    value = int(digits)
    if value > MAX_RECORD or kind not in (b"B", b"+"):
        return None
    if (kind == b"B" and at != 0) or (kind == b"+" and value == 0):
        return None
    return kind, value


class UsageView:
    """One process's view of a root's usage file: how far it was read, the base and the
    running total. A :class:`~kernelcache.capacity.size_cap.SizeCap` holds one (its
    ``usage``), appends to the file through it, and its eviction passes
    (:class:`~kernelcache.capacity.eviction.Eviction`) read it and leave there the size
    they measured.

    Args:
        store: the root whose usage file it reads.
        max_size: the cap.
        low_water: what a pass brings the root down to.
        reporting: in a helper process: a file refused is not warned about here (the process
            that started the helper reads the same file).
    """

    def __init__(self, store: Store, max_size: int, low_water: int, reporting: bool) -> None:
        self.store = store
        self.max_size = max_size
        self.low_water = low_water
        self.reporting = reporting
        #: the usage file last read: its inode number and first record (a pass's new file
        #: may get the number of one it replaced), and how far it was read
        self._inode: int | None = None
        self._head = b""
        self._offset = 0
        #: the base record (what the last pass measured) and the running total
        self.base = 0
        self.total = 0
        #: whether the file read holds a base (a size a pass measured)
        self.measured = False
        #: whether the file read holds what this module never writes (warned once): it is
        #: read no further, and a pass is due, which writes it anew
        self._refused = False

    def reset(self, measured: int | None = None) -> None:
        """Forget the file read: the next look reads it from its start. ``measured``: the
        root's size a pass just measured and wrote as the file's base (the estimate until
        then), or None where none is known."""
        self._inode, self._offset = None, 0
        self.base = self.total = measured or 0
        self.measured = measured is not None

    def due(self) -> bool:
        """Whether a pass is due: no measured base yet; or over the cap (when the last pass
        could not get under it, entries being in use: once a fifth of the cap more was
        written, so that such a pass is not repeated at every put)."""
        if not self.measured:
            return True
        if self.base > self.max_size:  # the last pass could not get under the cap
            return self.total >= self.base + (self.max_size - self.low_water)
        return self.total > self.max_size

    def append(self, nbytes: int) -> bool:
        """Append ``nbytes`` to the usage file and read what was appended since the last look;
        whether a pass is due. A file without a measured base (none yet, or removed by a prune:
        this put creates it) is due: the pass measures the root and writes the base."""
        root = self.store.root
        try:
            dfd = open_subdir(root, STATS_DIR, create=os.stat(root).st_uid == os.geteuid())
        except FileNotFoundError:
            return True
        try:
            fd = _open_appending(dfd)
            try:
                if nbytes > 0:  # (a record of nothing is never written: see _parse)
                    os.write(fd, usage_record(b"+", nbytes))
                    if os.fstat(fd).st_nlink == 0:
                        # a pass replaced the file as this put wrote: count it in the new one
                        # (perhaps twice: too high, which the next pass corrects)
                        again = _open_appending(dfd)
                        os.close(fd)
                        fd = again
                        os.write(fd, usage_record(b"+", nbytes))
                size = self.read_new(fd)
                if self._refused:  # read no further: this process counts its own
                    self.total += nbytes
                elif size > MAX_USAGE_BYTES:
                    self._compact(dfd, fd)
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
        return self.due()

    def read_new(self, fd: int) -> int:
        """Fold the records appended since the last look into :attr:`total`; the file's size.
        Reads at most :data:`MAX_USAGE_READ` bytes: a file with more unread, or holding what
        this module never writes (:func:`_parse`), is refused (:meth:`_refuse`)."""
        st = os.fstat(fd)
        head = os.pread(fd, RECORD, 0)
        if (st.st_ino, head) != (self._inode, self._head) or st.st_size < self._offset:
            # another file (a pass replaced it, or it is new): read it from the start
            self._inode, self._head, self._offset, self.base, self.total = st.st_ino, head, 0, 0, 0
            self.measured = self._refused = False
        if self._refused:
            return st.st_size
        unread = st.st_size - self._offset
        if unread > MAX_USAGE_READ:
            self._refuse(f"{unread} bytes to read, more than a usage file holds")
            return st.st_size
        data = os.pread(fd, unread // RECORD * RECORD, self._offset)
        for start in range(0, len(data) - RECORD + 1, RECORD):
            record = data[start : start + RECORD]
            parsed = _parse(record, self._offset)
            if parsed is None:
                self._refuse(f"at byte {self._offset}, {record!r} is no record kernelcache writes")
                break
            self._offset += RECORD
            kind, number = parsed
            if kind == b"B":
                self.base = self.total = number
                self.measured = True
            else:
                self.total += number
        return st.st_size

    def _refuse(self, why: str) -> None:
        """Stop reading the usage file (another program writes it, or it is damaged): a pass
        is due, which measures the root and writes the file anew; until then the estimate is
        what was read and what this process adds. Warned once per process."""
        self._refused = True
        self.measured = False
        if self.reporting:  # a helper: the process that started it reads the same file
            return
        warn_once(
            logger,
            (self.store.root, "usage"),
            "kernelcache: ignoring %s: %s; the next eviction pass writes it anew (if this"
            " comes back, a program other than kernelcache writes that file: find it, or"
            " remove the file)",
            os.path.join(self.store.root, STATS_DIR, USAGE_NAME),
            why,
        )

    def _compact(self, dfd: int, fd: int) -> None:
        """Rewrite the long usage file ``fd`` (read whole) as two records, the base and the
        rest, and what was appended since (:func:`replace_usage`); under the pass lock, tried
        once, and only while the file is still the one read."""
        try:
            held = self.store.locker.acquire(PASS_LOCK, shared=False, timeout=0)
        except (LockTimeout, LockUnavailable):
            return
        try:
            now = os.stat(USAGE_NAME, dir_fd=dfd, follow_symlinks=False)
            if now.st_ino != os.fstat(fd).st_ino:
                return  # a pass wrote it anew since
            rest = self.total - self.base
            head = usage_record(b"B", self.base) + (usage_record(b"+", rest) if rest > 0 else b"")
            replace_usage(dfd, fd, self._offset, head)
        except OSError as e:
            logger.debug("kernelcache: cannot compact %s/%s: %s", STATS_DIR, USAGE_NAME, e)
        finally:
            held.release()


def usage_end(root: str) -> tuple[int, int] | None:
    """(inode, size) of the usage file now, or None: where the records a pass's listing may
    not see begin."""
    try:
        st = os.stat(os.path.join(root, STATS_DIR, USAGE_NAME), follow_symlinks=False)
    except OSError:
        return None
    return (st.st_ino, st.st_size) if stat.S_ISREG(st.st_mode) else None


def _open_appending(dfd: int) -> int:
    """The usage file in the directory ``dfd`` (created if missing), open for reading and
    appending.

    Raises:
        OSError: it cannot be opened, or it is not a regular file of one link (a FIFO planted
            there is never waited on: :func:`~kernelcache.fsio.open_planted`).
    """
    return open_planted(USAGE_NAME, os.O_RDWR | os.O_APPEND | os.O_CREAT, dir_fd=dfd)


def open_usage(dfd: int) -> int | None:
    """The usage file in the directory ``dfd``, open for reading; None where there is none
    (or something else is there)."""
    try:
        fd = os.open(
            USAGE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
        )
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _additions_from(fd: int, begin: int) -> tuple[bytes, int]:
    """The ``+`` records (:func:`_parse`) of the usage file ``fd`` from offset ``begin`` on
    (at most :data:`MAX_USAGE_READ` bytes), and the offset read to (the end of the last whole
    line). Records are found line by line: what another program appended between them costs
    only its own lines, never the records after it."""
    size = os.fstat(fd).st_size
    if size <= begin:
        return b"", begin
    data = os.pread(fd, min(size - begin, MAX_USAGE_READ), begin)
    whole = data.rfind(b"\n") + 1
    kept, at = [], begin
    for line in data[:whole].split(b"\n")[:-1]:
        record = line + b"\n"
        parsed = _parse(record, at)
        if parsed is not None and parsed[0] == b"+":
            kept.append(record)
        at += len(record)
    return b"".join(kept), begin + whole


def replace_usage(dfd: int, old: int | None, begin: int, head: bytes) -> None:
    """Replace the usage file with ``head`` and the additions of the file ``old`` (open)
    from ``begin`` on, those appended until the replace took effect included: a put that
    appends to the old file after that sees it replaced, and appends again
    (:meth:`UsageView.append`), so no put goes uncounted. Caller holds the pass lock.

    Raises:
        OSError: the new file cannot be written.
    """
    since, end = _additions_from(old, begin) if old is not None else (b"", 0)
    replace_file(dfd, USAGE_NAME, head + since)
    if old is None:
        return
    late, _ = _additions_from(old, end)
    if late:
        fd = open_planted(USAGE_NAME, os.O_WRONLY | os.O_APPEND, dir_fd=dfd)
        try:
            os.write(fd, late)
        finally:
            os.close(fd)


def entries_of(root: str, seen: Mapping[str, EntryInfo] | None = None) -> list[EntryInfo]:
    """The entries of ``root`` as an eviction pass sees them, from one listing and the status
    of each entry's two files: key, extension (of its one artifact file), sizes and last-used
    stamp; no metadata is read (kernel, target and creation time are None). An entry in
    ``seen`` (by key, with the same extension) is taken from there instead of its files'
    status: a pass before saw it.

    A name that only looks like an entry is caught where it matters: a prune re-checks each
    entry under its lock before deleting it, and keeps one that is not what the plan saw (see
    :mod:`kernelcache.maintenance.prune`). Housekeeping is left to ``prune``.
    """
    metas: set[str] = set()
    arts: dict[str, str | None] = {}
    for name in os.listdir(root):
        key, dot, ext = name.partition(".")
        if not dot:
            continue
        if ext == META_EXT:
            metas.add(key)
        else:
            arts[key] = ext if key not in arts else None  # two artifacts: left to prune
    exts = {e: valid_ext(e) for e in set(arts.values()) if e is not None}
    rows = [(k, e) for k, e in arts.items() if e is not None and exts[e] and k in metas]
    if rows and not all_keys([k for k, _ in rows]):
        rows = [(k, e) for k, e in rows if KEY_PATTERN.fullmatch(k)]
    suffix = "." + META_EXT
    found: list[EntryInfo] = []
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for key, ext in rows:
            known = seen.get(key) if seen else None
            if known is not None and known.ext == ext:
                found.append(known)
                continue
            try:
                meta = os.stat(key + suffix, dir_fd=dfd, follow_symlinks=False)
                art = os.stat(f"{key}.{ext}", dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue  # deleted meanwhile
            if stat.S_ISREG(meta.st_mode) and stat.S_ISREG(art.st_mode):
                found.append(
                    EntryInfo(key, ext, art.st_size, meta.st_size, None, None, None, meta.st_mtime)
                )
    finally:
        os.close(dfd)
    return found


def discard_usage(stats_fd: int) -> None:
    """Remove the usage file from the root's ``.stats/``, open as ``stats_fd`` (best effort),
    after entries were removed outside an eviction pass: the next put that counts measures the
    root again."""
    try:
        remove_own_file(stats_fd, USAGE_NAME)
    except OSError as e:
        logger.debug("kernelcache: cannot remove %s/%s: %s", STATS_DIR, USAGE_NAME, e)
