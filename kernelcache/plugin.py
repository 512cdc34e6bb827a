"""What a package built on kernelcache uses of it besides the public API: the plugin surface.

A package that compiles and stores kernels (the bridge is one) imports ``kernelcache`` (the cache,
the store, their entries and errors), this module, and for the commands it adds
:mod:`kernelcache.cli`, and nothing else of kernelcache. What it finds here:

- **Declaring what it adds**, once, at import: its environment variables (:func:`setting`,
  :func:`register_variables`; parsed with :func:`parser`, in a job with :func:`job_settings`'s
  rule that a value that cannot be used costs only itself), the metadata fields of its entries
  (:func:`register_fields`, with the checks :func:`text` and :func:`integer`, each a
  :data:`FieldCheck`; which fields the entry digest covers), the extensions of its entry kinds that are usually absent
  (:func:`declare_sparse`), and its directories under a root (:func:`register_directory`).
- **Writing entries as kernelcache writes them**: the metadata of a kernel binary
  (:func:`make_metadata`, :data:`KERNEL_NAME`, :func:`covered_metadata`), the checks of machine
  code (:func:`artifact_problem`, :func:`elf_problem`, :func:`ptx_problem`, the ELF machines),
  the key grammar (:data:`KEY_PATTERN`, :func:`group_of`, :func:`digest_of`), counting hits (:func:`count`,
  :func:`flush`) and a user's records of what was checked (:func:`record_check`).
- **The foundation it shares**: one warning per process (:func:`warn_once`), the host and its
  processes (:data:`HOST`, :func:`pid_alive`), reading files others may have planted
  (:func:`open_regular`, :func:`load_json`), a lock on a file of its own waited for until a
  deadline (:func:`flock_by`), sizes (:func:`parse_size`, :func:`human_size`),
  name patterns (:func:`matcher`, :func:`is_pattern`, :data:`NAME_SEPARATOR`), and the errors
  those raise.

Each name is kernelcache's own, defined in the module that owns its concern; this module only
declares which of them are the surface, so that a change behind it never reaches a plugin.
"""

from __future__ import annotations

from .config import (
    Settings,
    choice,
    job_settings,
    misspelt,
    parse_variable,
    parser,
    path,
    register_variables,
    setting,
    settings,
    variables_of,
)
from .errors import KernelCacheError, NotRegularFile
from .formats import EM_AMDGPU, EM_CUDA, artifact_problem, elf_problem, ptx_problem
from .fsio import flock_by, load_json, open_regular
from .keys import GROUP_CHARS, KEY_PATTERN, declare_sparse, digest_of, group_of
from .naming import NAME_SEPARATOR, is_pattern, matcher
from .process import HOST, pid_alive, warn_once
from .schema import (
    KERNEL_NAME,
    FieldCheck,
    covered_metadata,
    integer,
    make_metadata,
    register_fields,
    text,
)
from .stats import count, flush
from .store import check_recorded, record_check, register_directory
from .units import human_size, parse_size

__all__ = [
    "EM_AMDGPU",
    "EM_CUDA",
    "GROUP_CHARS",
    "HOST",
    "KERNEL_NAME",
    "KEY_PATTERN",
    "NAME_SEPARATOR",
    "FieldCheck",
    "KernelCacheError",
    "NotRegularFile",
    "Settings",
    "artifact_problem",
    "check_recorded",
    "choice",
    "count",
    "covered_metadata",
    "declare_sparse",
    "digest_of",
    "elf_problem",
    "flock_by",
    "flush",
    "group_of",
    "human_size",
    "integer",
    "is_pattern",
    "job_settings",
    "load_json",
    "make_metadata",
    "matcher",
    "misspelt",
    "open_regular",
    "parse_size",
    "parse_variable",
    "parser",
    "path",
    "pid_alive",
    "ptx_problem",
    "record_check",
    "register_directory",
    "register_fields",
    "register_variables",
    "setting",
    "settings",
    "text",
    "variables_of",
    "warn_once",
]
