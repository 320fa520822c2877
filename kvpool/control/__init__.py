"""The control channel from a server's HTTP process to its engine core (no vLLM import here):
``messages`` holds the typed operations, replies and error kinds; ``channel`` the abstract-socket
server (in the engine core) and the asyncio client (in the HTTP process)."""

from kvpool.control.channel import AsyncControlClient, ControlServer, EngineUnavailable
from kvpool.control.messages import Check, ControlOp, ControlRequest, ErrorKind, Resize, Snapshot, Trim

__all__ = [
    "AsyncControlClient",
    "Check",
    "ControlOp",
    "ControlRequest",
    "ControlServer",
    "EngineUnavailable",
    "ErrorKind",
    "Resize",
    "Snapshot",
    "Trim",
]
