"""``python -m kernelcache.cli``: the ``kernelcache`` command."""

from .app import run

run()
