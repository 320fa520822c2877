"""The pool's error taxonomy.

Three kinds, so callers can react without parsing messages:

* :class:`ConfigError` -- a setting is wrong; the message names the setting and the fix.
  Retrying cannot help.
* :class:`PoolExhausted` -- transient: no block or page is available under the current limit.
  Retry after blocks are freed, or raise the limit.
* :class:`BackendUnavailable` -- the memory backend cannot run here (no CUDA driver, mmap
  refused). Choose another backend or fix the host.

Every operation that raises leaves the pool exactly as it was before the call.
"""

from __future__ import annotations


class KVPoolError(Exception):
    """Base of every error this library raises on purpose."""


class ConfigError(KVPoolError, ValueError):
    """A setting or argument is invalid; the message says which one and what to change."""


class PoolExhausted(KVPoolError):
    """No capacity under the current limit; transient, retry once blocks are freed."""


class BackendUnavailable(KVPoolError, RuntimeError):
    """The memory backend cannot be used on this host (driver missing, mapping refused)."""
