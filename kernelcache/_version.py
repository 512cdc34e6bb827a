"""The package's version (also in pyproject.toml), in a module of its own so that the modules
that record it (metadata, bundles, ``doctor``) need not import the package itself."""

__version__ = "0.1.0"
