"""``karotte dashboard``: a local web view of a directory of transcripts, live while runs go on.

:func:`create_app` builds the ASGI app; :func:`serve` runs it with uvicorn on a bound socket.
"""

from __future__ import annotations

from karotte.host.dashboard.app import create_app
from karotte.host.dashboard.server import bind, serve

__all__ = ["bind", "create_app", "serve"]
