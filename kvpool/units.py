"""Byte sizes as people write them on a command line: one parser for every flag of the library
and the server (``kvpool_server`` takes it from here, not from the vLLM integration).

Binary units, as vLLM's own flags use them: ``256M`` = ``256Mi`` = ``256MiB`` = 256 x 2**20.
(Kubernetes quantities in the ``ColocatedModels`` resource follow Kubernetes' rules instead:
``M`` = 10**6, ``Mi`` = 2**20; the operator never passes a suffixed size to a server.)
"""

from __future__ import annotations

import re

from kvpool.errors import ConfigError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(IB|I|B)?\s*", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """'256M', '256Mi', '256MiB', '4G', '1.5G', '1048576' -> bytes (binary units)."""
    m = _SIZE.fullmatch(text)
    if m is None or (m.group(2) == "" and ("." in m.group(1) or (m.group(3) or "").upper().startswith("I"))):
        raise ConfigError(f"{text!r} is not a byte size (e.g. 268435456, 256M, 256Mi, 4G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])
