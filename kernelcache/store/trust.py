"""The trust policy of a root: whose files a store serves, and the write bits its own files keep.

An artifact is code that will run on the GPU. Under ``owner`` and ``group`` a file of an entry
is served only if it is owned by a trusted user, writable by no one outside the trusted set (no
write bit for others; a group write bit only under ``group`` and for the root directory's
group) and has exactly one link. What this process writes keeps only the write bits its own
policy accepts, so it always passes its own checks; its lock files keep only the read bits of
the users the policy trusts (whoever can open a lock file can hold a flock on it).
"""

from __future__ import annotations

import logging
import os
import stat

from ..errors import InvalidValue
from ..process import warn_once

logger = logging.getLogger(__name__)

#: policy -> whose entries are served
TRUST_POLICIES = {
    "group": "this user, root, the root directory's owner, and members of its group",
    "owner": "this user, root and the root directory's owner",
    "any": "every user (a private or fully trusted cache)",
}
SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH
SHARED_READ = stat.S_IRGRP | stat.S_IROTH


def check_policy(policy: str) -> str:
    """Return ``policy`` if it is one of :data:`TRUST_POLICIES`.

    Raises:
        ValueError: it is not (the message lists them).
    """
    if policy not in TRUST_POLICIES:
        raise InvalidValue(f"trust policy {policy!r} is not one of {', '.join(TRUST_POLICIES)}")
    return policy


def in_group(uid: int, gid: int) -> bool:
    """Whether the user ``uid`` belongs to group ``gid`` (primary or supplementary)."""
    import grp
    import pwd

    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    if user.pw_gid == gid:
        return True
    try:
        return user.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


class TrustPolicy:
    """The policy ``policy`` applied to the files of ``root``; verdicts on users are
    remembered, and each refusal is warned about once per root."""

    def __init__(self, root: str, policy: str) -> None:
        self.root = root
        self.policy = check_policy(policy)
        self._trusted_uids: set[int] = set()
        self._untrusted_uids: set[int] = set()
        self._root_owner: tuple[int, int] | None = None

    def _root_ids(self) -> tuple[int, int] | None:
        """(owner, group) of the root directory, read once; None while it cannot be read."""
        if self._root_owner is None:
            try:
                st = os.stat(self.root)
            except OSError:
                return None
            self._root_owner = (st.st_uid, st.st_gid)
        return self._root_owner

    def trusts(self, uid: int) -> bool:
        """Whether the user ``uid`` is one this policy trusts; remembered, never warned about."""
        if uid in self._trusted_uids:
            return True
        if uid in self._untrusted_uids:
            return False
        trusted = self.policy == "any" or uid in (0, os.geteuid())
        if not trusted:
            ids = self._root_ids()
            if ids is not None:
                trusted = uid == ids[0] or (self.policy == "group" and in_group(uid, ids[1]))
        (self._trusted_uids if trusted else self._untrusted_uids).add(uid)
        return trusted

    def _trusts(self, uid: int) -> bool:
        """Whether files owned by ``uid`` may be served; warned about once when not."""
        trusted = self.trusts(uid)
        if not trusted:
            warn_once(
                logger,
                (self.root, f"untrusted-{uid}"),
                "kernelcache: refusing artifacts under %s owned by user %d: not this user, root, "
                "the root directory's owner%s (KERNELCACHE_TRUST=%s)",
                self.root,
                uid,
                " or a member of its group" if self.policy == "group" else "",
                self.policy,
            )
        return trusted

    def may_serve(self, st: os.stat_result) -> bool:
        """The fast check: a trusted owner, no write bit for group or others, one link."""
        return self.policy == "any" or (
            st.st_uid in self._trusted_uids and not st.st_mode & SHARED_WRITE and st.st_nlink == 1
        )

    def refusal(self, st: os.stat_result, what: str) -> str | None:
        """Why the file ``what`` (``"artifact"``, ``"metadata"``) of status ``st`` may not be
        served; None if it may. A second link of a file could be written through, or be
        another key's entry."""
        if self.may_serve(st):
            return None
        uid = st.st_uid
        if uid not in self._trusted_uids and not self._trusts(uid):
            return f"{what} owned by untrusted user {uid}"
        topic, reason = self._why_not(st, what)
        if reason is not None:
            warn_once(
                logger,
                (self.root, f"refused-{topic}"),
                "kernelcache: refusing an entry under %s: %s (KERNELCACHE_TRUST=%s: an entry's "
                "files must be writable only by the users it trusts, with one link each)",
                self.root,
                reason,
                self.policy,
            )
        return reason

    def accepts(self, st: os.stat_result) -> bool:
        """Whether a file of status ``st`` passes this policy (as :meth:`refusal`, without a
        warning): for files the cache only reads as a hint, such as the scan index."""
        if self.may_serve(st):
            return True
        return self.trusts(st.st_uid) and self._why_not(st, "file")[1] is None

    def _why_not(self, st: os.stat_result, what: str) -> tuple[str, str | None]:
        """(topic, reason) a file of a trusted owner is refused for; reason None if it is not."""
        mode = stat.S_IMODE(st.st_mode)
        writable = mode & SHARED_WRITE
        topic, reason = "", None
        if writable & stat.S_IWOTH:
            topic, reason = "other-writable", f"{what} is writable by every user (mode {mode:o})"
        elif writable and self.policy == "owner":
            topic = "group-writable"
            reason = (
                f"{what} is writable by its group (mode {mode:o}), which the owner policy "
                "does not trust"
            )
        elif writable:
            ids = self._root_ids()
            if ids is None or st.st_gid != ids[1]:
                topic = "foreign-group"
                reason = f"{what} is writable by group {st.st_gid}, not the root directory's group"
        if reason is None and st.st_nlink != 1:
            topic, reason = "links", f"{what} has {st.st_nlink} hard links"
        return topic, reason

    def limit_write_bits(self, fd: int) -> None:
        """Drop from the new file ``fd`` the write bits this policy would refuse, whatever the
        umask left it, so that it passes this policy's own checks."""
        st = os.fstat(fd)
        extra = st.st_mode & SHARED_WRITE & ~self.write_bits(st.st_gid)
        if extra:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~extra)

    def limit_access(self, fd: int, st: os.stat_result | None = None) -> None:
        """Drop from the file ``fd`` (of this user; ``st``: its status, if known) the read and
        write bits of users this policy does not trust: for lock files, which whoever can open
        may hold a flock on."""
        if st is None:
            st = os.fstat(fd)
        allowed = self.write_bits(st.st_gid) | self.read_bits(st.st_gid)
        extra = st.st_mode & (SHARED_WRITE | SHARED_READ) & ~allowed
        if extra:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~extra)

    def read_bits(self, gid: int) -> int:
        """The read bits for group and others that a file of group ``gid`` under the root may
        keep: only the users this policy trusts may open it."""
        return self._trusted_bits(gid, SHARED_READ, stat.S_IRGRP)

    def write_bits(self, gid: int) -> int:
        """The write bits for group and others that a file of group ``gid`` written under the
        root may keep, so that it passes this policy's own checks."""
        return self._trusted_bits(gid, SHARED_WRITE, stat.S_IWGRP)

    def _trusted_bits(self, gid: int, everyone: int, group: int) -> int:
        """Of the bits ``everyone`` (group's and others'), those of the users this policy
        trusts for a file of group ``gid``: all under ``any``; ``group`` under ``group`` when
        the file's group is the root directory's; none else."""
        if self.policy == "any":
            return everyone
        if self.policy == "group":
            ids = self._root_ids()
            if ids is not None and gid == ids[1]:
                return group
        return 0
