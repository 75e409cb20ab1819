"""The backend-neutral Windows Sockets switch."""

from .connection import Connection
from .endpoint import Endpoint
from .switch import Switch

__all__ = ["Connection", "Endpoint", "Switch"]
