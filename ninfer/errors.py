"""Typed errors a user can cause.

Every error here carries a one-line message that says what was wrong and what to do. The CLI
prints it without a traceback and exits non-zero. Internal invariant failures are *not* these
types: they stay ordinary exceptions (AssertionError, RuntimeError) and keep their traceback.
"""

from __future__ import annotations


class NinferError(Exception):
    """Base of every user-facing error."""


class ArtifactError(NinferError):
    """A .ninfer file is malformed: bad magic, unknown version, truncated, checksum mismatch,
    missing or misshapen tensor, unknown architecture."""


class ConvertError(NinferError):
    """A conversion source cannot be converted: missing file, unsupported quant type or
    architecture."""


class ConfigError(NinferError):
    """An option or combination of options is impossible (bad flag value, capacity too large)."""
