"""The variants of one call for one target, their kernels fetched on demand: each variant's
kernel, or why it is left out of the call.

A config is left out, as Triton's autotuner leaves it out, when it cannot compile (see
:mod:`bridge.entries.failures`: remembered in the cache, and consulted only where the cache holds no
kernel for it: a kernel entry is what runs) or cannot launch on the target: it has more threads than
a block may have there (its ``num_warps`` at the target's warp size: never compiled), it needs more
shared memory than one block may have there (:func:`bridge.vendors.targets.max_shared_memory`: the
local device's figure where it can be read, else the vendor's table), or more tensor memory
than Triton allows. Left-out configs are named in one warning per kernel and process (a later
call that leaves out other configs names those); when none is left, the call fails with a
:class:`~bridge.exceptions.NoConfigError` naming every config and why.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..entries import failures
from ..entries.kernels import kernel_kind
from ..exceptions import LeftOut, NoConfigError
from ..identity.specialize import threads_problem
from ..vendors import targets
from . import fetch
from .fetch import KernelBinary

if TYPE_CHECKING:
    from kernelcache import Artifact, Cache

    from ..identity.specialize import Specialization, Usable
    from ..vendors.targets import Target

logger = logging.getLogger(__name__)

#: the tensor memory one block may use, in columns (Triton's check when it loads a kernel)
MAX_TMEM_COLUMNS = 512

#: kernels fetched in this process: (key, target, cache root) -> the kernel, or why it cannot
#: compile
Memo = dict[tuple[str, str, str], KernelBinary | str]

_warned: set[tuple[str, str, str]] = set()
_lock = threading.Lock()


def launch_problem(meta: Mapping[str, Any], target: Target, device: Any = None) -> str | None:
    """Why a kernel (its entry's metadata) cannot launch on ``target`` (on the local
    ``device``, where given), or None."""
    shared = int(meta.get("shared", 0))
    limit = targets.max_shared_memory(target, device)
    if limit is not None and shared > limit:
        return (
            f"needs {shared:,} bytes of shared memory per block; {target} has {limit:,} "
            "(use smaller blocks or fewer stages)"
        )
    tmem = int(meta.get("tmem_size", 0))
    if tmem > MAX_TMEM_COLUMNS:
        return f"needs {tmem} columns of tensor memory; there are {MAX_TMEM_COLUMNS}"
    return None


def known_left_out(
    specs: Sequence[Specialization], cache: Cache, device: Any = None
) -> dict[int, str]:
    """Why each of ``specs`` that the cache knows cannot launch (its kernel's entry) or, having
    no kernel entry, cannot compile (a failure entry) is left out; nothing is compiled. The
    entry is the one a lowering would run (:func:`bridge.readsets.read_sets.follow`: not one
    whose reads find something else now), and wins over a failure entry beside it."""
    found: dict[int, str] = {}
    for i, spec in enumerate(specs):
        key, art = fetch.followed(spec, functools.partial(_uncounted, cache, spec.ext))
        if art is not None:
            why = launch_problem(art.meta, spec.target, device)
        else:
            why = None if key is None else failures.remembered(cache, key)
        if why is not None:
            found[i] = why
    return found


def _uncounted(cache: Cache, ext: str, key: str) -> Artifact | None:
    """The kernel entry ``key``, read without counting a hit or a miss."""
    return kernel_kind(ext).get(cache, key, counted=False)


def _config(spec: Specialization) -> str:
    return spec.variant.description or "the kernel"


def _named(spec: Specialization, reason: str) -> str:
    """A left-out variant and why, for messages."""
    desc = spec.variant.description
    return f"[{desc}] {reason}" if desc else reason


class Variants:
    """The variants of one call (``specs``, as :func:`bridge.identity.specialize.specialize_call` made
    them) with their kernels, fetched when first asked for. ``usable(spec)`` says which cached
    entries will do for a variant; ``memo`` keeps what was fetched across calls of a process."""

    def __init__(
        self,
        specs: Sequence[Specialization],
        cache: Cache,
        *,
        device: Any = None,
        usable: Callable[[Specialization], Usable | None] | None = None,
        memo: Memo | None = None,
    ) -> None:
        self.specs = list(specs)
        self.cache = cache
        self.device = device
        self.usable = usable
        self.memo: Memo = memo if memo is not None else {}
        self._found: dict[int, KernelBinary | str] = {}
        #: variants left out on the cache's word alone (see :meth:`_confirmed`)
        self._hearsay: set[int] = set()

    def _memo_key(self, index: int) -> tuple[str, str, str]:
        spec = self.specs[index]
        return (spec.key, str(spec.target), str(self.cache.root))

    def _remembered(self, index: int) -> bool:
        """Whether the memo holds the kernel of variant ``index`` as the frontend would
        generate it now (a kernel whose reads find something else is forgotten)."""
        known = self.memo.get(self._memo_key(index))
        if isinstance(known, KernelBinary) and not fetch.stale(self.specs[index], known.meta).fresh:
            del self.memo[self._memo_key(index)]
            return False
        return known is not None

    def fetch(self, indices: Iterable[int]) -> None:
        """Fetch the kernels of ``indices`` (every missing one at once, compiled here or by
        another process, whichever is free first)."""
        wanted = [i for i in dict.fromkeys(indices) if i not in self._found]
        fetched: dict[int, KernelBinary | str] = {}
        for i in wanted:  # (over a limit the options show: never compiled)
            spec = self.specs[i]
            too_many = threads_problem(spec.target, int(spec.bound.options.num_warps))
            if too_many is not None:
                fetched[i] = too_many
        todo = [i for i in wanted if i not in fetched and not self._remembered(i)]
        if todo:
            checks = [self.usable(self.specs[i]) if self.usable else None for i in todo]
            got = fetch.fetch_many([self.specs[i] for i in todo], self.cache, checks)
            for i, result in zip(todo, got, strict=True):
                fetched[i] = result.reason if isinstance(result, LeftOut) else result
                self.memo[self._memo_key(i)] = fetched[i]
                if isinstance(result, LeftOut) and result.remembered:
                    self._hearsay.add(i)
        for i in wanted:
            found = fetched[i] if i in fetched else self.memo[self._memo_key(i)]
            if isinstance(found, KernelBinary):
                spec = self.specs[i]
                problem = launch_problem(found.meta, spec.target, self.device)
                if problem is not None and not found.built and i in fetched:
                    self._hearsay.add(i)
                found = problem or found
            self._found[i] = found

    def left_out(self, indices: Iterable[int] | None = None) -> dict[int, str]:
        """Why each of ``indices`` (default: every variant) that cannot compile or launch is
        left out."""
        chosen = range(len(self.specs)) if indices is None else list(indices)
        self.fetch(chosen)
        return {i: r for i in chosen if isinstance(r := self._found[i], str)}

    def kernel(self, index: int) -> KernelBinary:
        """The kernel of variant ``index``.

        Raises:
            NoConfigError: it is left out.
        """
        self.viable([index])
        found = self._found[index]
        assert isinstance(found, KernelBinary)
        return found

    def viable(self, indices: Iterable[int] | None = None) -> list[int]:
        """Those of ``indices`` (default: every variant) that are not left out, warning about
        those that are.

        Raises:
            NoConfigError: every one is left out.
        """
        chosen = list(range(len(self.specs))) if indices is None else list(indices)
        left = self.left_out(chosen)
        kept = [i for i in chosen if i not in left] or self._confirmed(left)
        left = {i: r for i, r in left.items() if i not in kept}
        if left:
            self._warn(left)
        if not kept:
            spec = self.specs[chosen[0]]
            why = "; ".join(_named(self.specs[i], r) for i, r in left.items())
            raise NoConfigError(
                f"no config of {spec.parts.qualname} can run on {spec.target}: {why}. Give it "
                "configs that fit the target"
            )
        return kept

    def _confirmed(self, left: Mapping[int, str]) -> list[int]:
        """Those of ``left`` (every variant asked for) that compile and launch here after all,
        compiled again in memory before the call is given up, of those the cache alone said
        could not (a failure entry, a cached kernel's metadata: another writer's, perhaps,
        never a compile of this process)."""
        kept = []
        for i, why in left.items():
            if i not in self._hearsay:
                continue
            spec = self.specs[i]
            got = fetch.compiled_here(spec)
            if (
                isinstance(got, KernelBinary)
                and launch_problem(got.meta, spec.target, self.device) is None
            ):
                logger.warning(
                    "kernelcache: the cache says %s cannot run on %s (%s), but it compiles here: "
                    "using what was compiled now (run `kernelcache verify`)",
                    spec.parts.qualname,
                    spec.target,
                    why,
                )
                self._found[i] = self.memo[self._memo_key(i)] = got
                kept.append(i)
        return kept

    def _warn(self, left: Mapping[int, str]) -> None:
        spec = self.specs[next(iter(left))]
        where = (spec.parts.qualname, str(spec.target))
        with _lock:
            new = {i: r for i, r in left.items() if (*where, _config(self.specs[i])) not in _warned}
            _warned.update((*where, _config(self.specs[i])) for i in new)
        if new and len(self.specs) > 1:
            logger.warning(
                "kernelcache: %s on %s: left out %d of its %d configs, which cannot compile or "
                "launch there (as Triton's autotuner does): %s",
                *where,
                len(new),
                len(self.specs),
                "; ".join(_named(self.specs[i], r) for i, r in new.items()),
            )
