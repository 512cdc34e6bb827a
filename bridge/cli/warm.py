"""``kernelcache warm``: :func:`bridge.warm.warm` with a progress bar, its report printed (the
summary or the ``--json`` document), and its exit code."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

from ..compile.compiler import output_to_stderr
from ..exceptions import ManifestError, RootError
from ..warm import warm

logger = logging.getLogger(__name__)


def run(
    manifest: str,
    targets: Sequence[str],
    *,
    root: str | None = None,
    json: bool = False,
    disabled: bool = False,
    jobs: int | None = None,
    allow_changed: bool = False,
    devices: Sequence[str] = (),
    all_configs: bool = False,
) -> int:
    """``kernelcache warm``: warm, print the summary (or the JSON document), return the exit
    code: 0 all warmed, 1 something failed (listed with its reason).

    Raises:
        kernelcache.cli.UsageError: a bad target, an unreadable manifest, a missing Triton
            backend, a disabled cache (``disabled``: ``$KERNELCACHE_DISABLE``), ``jobs`` < 1
            (the CLI exits 2 with the message).
    """
    from kernelcache.cli import Output, UsageError, bar, interrupted_keeping, plural

    from ..exceptions import BackendUnavailable, TargetError

    if disabled:
        raise UsageError("KERNELCACHE_DISABLE is set: there is no cache to warm; unset it")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    out = Output(json)
    quiet = output_to_stderr() if json else contextlib.nullcontext()
    with quiet, bar("warming", None, json_mode=json, unit="kernels") as shown:
        try:
            report = warm(
                manifest,
                targets,
                cache=root,
                jobs=jobs,
                allow_changed=allow_changed,
                devices=devices,
                all_configs=all_configs,
                progress=shown,
                on_planned=shown.set_total,
            )
        except (ManifestError, TargetError, BackendUnavailable) as e:
            raise UsageError(str(e)) from None
        except KeyboardInterrupt as e:
            if not hasattr(e, "stored"):  # (before it compiled: the generic words are true)
                raise
            planned, kept, where = e.stored
            raise interrupted_keeping(
                f"{plural(kept, 'kernel')} of the {planned:,} it was compiling "
                f"{'is' if kept == 1 else 'are'} stored in {where}, whole; the compiles "
                "under way were stopped and stored nothing"
            ) from None
        except RootError as e:
            raise UsageError(e.strerror) from None
    if not report.records and not report.failures:
        logger.warning("kernelcache: %s holds no records: nothing to warm", manifest)
    out.emit(report.as_json, report.summary)
    return 0 if report.ok else 1
