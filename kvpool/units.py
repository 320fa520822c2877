"""Byte sizes as people write them: one grammar for every byte flag of the library and the server
and every byte field of the ``ColocatedModels`` resource -- Kubernetes quantities:

    plain integers           268435456
    binary suffixes          Ki Mi Gi Ti   (256Mi = 256 x 2**20)
    decimal suffixes         K  M  G       (256M  = 256 x 10**6, as in a Kubernetes manifest)

So "512M" means the same to the server and to the operator (it used to be 512 MiB to one and
512 x 10**6 to the other). The operator keeps a copy (``kvpool_operator.spec.quantity``: its image
carries no kvpool); a test holds the two to the same answers on generated input.
"""

from __future__ import annotations

import re

from kvpool.errors import ConfigError

UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9}
QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|K|M|G)?$")


def parse_bytes(text: str) -> int:
    """'268435456', '256Mi', '4Gi', '512M' -> bytes."""
    m = QUANTITY.match(text.strip())
    if m is None:
        raise ConfigError(f"{text!r} is not a byte size: an integer or a quantity such as 256Mi, 4Gi (binary) or 512M")
    return int(m.group(1)) * UNITS[m.group(2) or ""]
