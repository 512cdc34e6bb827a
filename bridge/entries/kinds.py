"""What a kind of entry the bridge stores is, as one type (its extension, how its key is derived
from the key it belongs to, how a lookup of it is counted, how long a put of it waits, whether
it is usually absent, and the verbs that store and look it up), and the registry of every kind.

Every entry the bridge stores is of a kind, an :class:`EntryKind` declared by the module of
this package that owns its documents (``PTX = EntryKind("ptx", ...)`` in :mod:`.kernels`); a
kernel's own entry is of the kind of its vendor's machine code (``cubin``, ``hsaco``:
:attr:`bridge.vendors.vendor.Vendor.binary_ext`, :func:`.kernels.kernel_kind`), stored under
the kernel key itself. An entry belongs
to a key, its owner (a kernel key, a lowering key, a decision key): its own key is
:func:`derived_key` of its owner and its role (by convention, its extension), or its owner's key
itself (a decision, a memo). What a kind stores (its document, its metadata, what it checks when
reading one back) is its module's. A kind registers itself when it is made: its extension is
taken (a second kind with it is refused), and a usually absent kind is declared sparse to the
remote tiers (:func:`kernelcache.keys.declare_sparse`); :func:`declared_kinds` is every kind.

Invariants: a kind is declared once, under one name, in the module that owns its documents;
no other module of the bridge names its extension, nor calls the cache for an entry of it but
through the kind (``tests/system/test_layering_bridge.py`` checks it); a kind's key, extension
and metadata are the same in every process and release (``tests/bridge/entries/test_kinds.py``
pins them), so changing :func:`derived_key` or a role orphans every stored entry of the kinds
it derives; a derived key shares the group of the key it belongs to.
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kernelcache.plugin import GROUP_CHARS, KEY_PATTERN, declare_sparse, group_of

if TYPE_CHECKING:
    from kernelcache import Artifact, Cache

T = TypeVar("T")
#: every kind made so far, by its extension (:class:`EntryKind` adds itself)
_BY_EXT: dict[str, EntryKind] = {}
#: what makes an entry on a miss: its data and metadata
Build = Callable[[], "tuple[bytes, Mapping[str, Any]]"]
#: a check of an entry found in the remote tier: a reason to refuse it, or None
Accept = Callable[["Artifact"], "str | None"]
#: what tells apart the entries of one kind that belong to one key (a lowering's state, a
#: sample's index), or None
Part = str | int | None


def derived_key(key: str, role: str) -> str:
    """The key of a companion entry of ``key`` (e.g. ``role="ptx"``): in ``key``'s group (see
    :func:`kernelcache.keys.group_of`) where ``key`` is a cache key, so that a remote tier keeps
    an entry and its companions together."""
    digest = hashlib.sha256(f"{key}:{role}".encode()).hexdigest()
    if KEY_PATTERN.fullmatch(key) is None:
        return digest
    return group_of(key) + digest[GROUP_CHARS:]


@dataclass(frozen=True)
class EntryKind:
    """One kind of entry: what is particular to it, and the verbs that store and look up its
    entries in a cache, each given the key the entry belongs to (``owner``)."""

    #: the extension of its entries
    ext: str
    #: the role its key is derived with from its owner's (:func:`derived_key`), ``{}`` standing
    #: for the ``part`` that tells apart several entries of one owner; None: its owner's key
    role: str | None
    #: how a lookup is counted (:meth:`kernelcache.Cache.get`): False, not at all (the hit rate
    #: is about kernels); or the class of lookups it is counted in
    counted: bool | str = False
    #: how long a put waits for the key's lock (:meth:`kernelcache.Cache.put`): None, the lock
    #: timeout; 0, never (another process holding it writes the same bytes)
    wait: float | None = None
    #: usually absent when looked up: a miss must not wait on a slow remote tier
    sparse: bool = False
    #: the reason an entry that does not decode is quarantined with (:meth:`load`)
    corrupt: str = ""

    def __post_init__(self) -> None:
        taken = _BY_EXT.get(self.ext)
        if taken is not None:
            raise ValueError(
                f"an entry kind with the extension {self.ext!r} is declared already ({taken}):"
                " each kind needs its own extension"
            )
        _BY_EXT[self.ext] = self
        if self.sparse:
            declare_sparse(self.ext)

    def key(self, owner: str, part: Part = None) -> str:
        """The key of the entry of ``owner`` (and ``part``, where the role has a ``{}``)."""
        if (self.role is not None and "{}" in self.role) != (part is not None):
            needs = "needs a" if part is None else "takes no"
            raise TypeError(f"the key of a {self.ext} entry {needs} part")
        if self.role is None:
            return owner
        return derived_key(owner, self.role.format(part))

    def get(
        self,
        cache: Cache,
        owner: str,
        part: Part = None,
        *,
        counted: bool | str | None = None,
        accept: Accept | None = None,
        copy: bool = True,
    ) -> Artifact | None:
        """The entry of ``owner``, if the cache has one (counted as :attr:`counted` says, or
        as ``counted`` does where given: a lookup that is not one of the kind's usual ones;
        ``accept`` and ``copy``: see :meth:`kernelcache.Cache.remote_lookup`)."""
        counted = self.counted if counted is None else counted
        return cache.get(self.key(owner, part), self.ext, counted=counted, accept=accept, copy=copy)

    def load(
        self,
        cache: Cache,
        owner: str,
        decode: Callable[[bytes], T | None],
        part: Part = None,
        *,
        admit: Callable[[T], str | None] | None = None,
        copy: bool = True,
    ) -> tuple[Artifact, T] | None:
        """The entry of ``owner`` and what ``decode`` makes of its bytes; an entry it makes
        nothing of (None) is a corrupt entry: a miss, quarantined (:attr:`corrupt`). An entry
        of the remote tier is judged at its door: one that does not decode, or that ``admit``
        refuses (a reason), is a miss never copied into a local root; ``copy=False`` returns
        one without a copy (see :meth:`kernelcache.Cache.keep`)."""

        decoded: list[Any] = []  # (what the door decoded: the bytes, and what they made)

        def door(art: Artifact) -> str | None:
            found = decode(art.data)
            decoded[:] = [art.data, found]
            if found is None:
                return self.corrupt or f"a {self.ext} entry that does not decode"
            return None if admit is None else admit(found)

        art = self.get(cache, owner, part, accept=door, copy=copy)
        if art is None:
            return None
        found = decoded[1] if decoded and decoded[0] is art.data else decode(art.data)
        if found is None:
            cache.quarantine(art, self.corrupt)
            return None
        return art, found

    def put(
        self, cache: Cache, owner: str, data: bytes, meta: Mapping[str, Any], part: Part = None
    ) -> Artifact:
        """Store ``data`` as the entry of ``owner`` (the first writer's is kept), waiting for
        its lock as :attr:`wait` says."""
        return cache.put(self.key(owner, part), self.ext, data, meta, wait=self.wait)

    def replace(
        self, cache: Cache, owner: str, data: bytes, meta: Mapping[str, Any], part: Part = None
    ) -> Artifact:
        """Store ``data`` as the entry of ``owner`` in place of the one there, if any."""
        return cache.replace(self.key(owner, part), self.ext, data, meta, wait=self.wait)

    def quarantine(self, cache: Cache, art: Artifact, reason: str) -> bool:
        """Report ``art``, an entry of this kind, unusable for ``reason`` (a corrupt entry)."""
        return cache.quarantine(art, reason)

    def get_or_create(self, cache: Cache, owner: str, build: Build, part: Part = None) -> Artifact:
        """The entry of ``owner``, made by ``build()`` once across processes if missing."""
        return cache.get_or_create(self.key(owner, part), self.ext, build)

    def get_or_create_many(
        self, cache: Cache, owner: str, builds: Sequence[tuple[Part, Build]]
    ) -> list[Artifact]:
        """The entries of ``owner``'s parts, in order, each made by its build if missing (by
        whichever process reaches it first: :meth:`kernelcache.Cache.get_or_create_many`)."""
        from kernelcache import BuildItem

        return cache.get_or_create_many(
            [BuildItem(self.key(owner, part), self.ext, build) for part, build in builds]
        )

    def rebuild(
        self, cache: Cache, owner: str, build: Build, *, stale: Artifact, part: Part = None
    ) -> Artifact:
        """The entry of ``owner`` made again by ``build()`` in place of ``stale``, what a read
        returned that the caller cannot use (once across processes)."""
        return cache.rebuild(self.key(owner, part), self.ext, build, stale=stale)


def get_or_create_each(
    cache: Cache,
    wanted: Sequence[tuple[EntryKind, str, Build]],
    *,
    wait: bool = True,
    accepts: Sequence[Accept | None] | None = None,
) -> Iterator[tuple[int, Artifact | Exception | None]]:
    """``(index, result)`` for each ``(kind, owner, build)`` of ``wanted`` (of one kind or
    several) as its entry is ready, each made by its build if missing, with work stealing
    (:meth:`kernelcache.Cache.get_or_create_each`, which says what a result is); ``accepts``:
    for each, the check of an entry found in the remote tier before it is published (None:
    none)."""
    from kernelcache import BuildItem

    checks = [None] * len(wanted) if accepts is None else accepts
    items = [
        BuildItem(kind.key(owner), kind.ext, build, check)
        for (kind, owner, build), check in zip(wanted, checks, strict=True)
    ]
    return cache.get_or_create_each(items, wait=wait)


def declared_kinds() -> tuple[EntryKind, ...]:
    """Every kind the bridge declares: each module of this package is imported first (a kind
    is declared where its documents are), so the answer does not depend on what was imported."""
    package = importlib.import_module(__name__.rpartition(".")[0])
    for module in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        importlib.import_module(module.name)
    return tuple(sorted(_BY_EXT.values(), key=lambda kind: kind.ext))
