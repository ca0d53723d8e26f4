"""The run backend: a central service that collects runs from many machines (docs/backend.md).

:mod:`karotte.backend.protocol` holds the wire format (pydantic models and paths), shared by the
harness's client (:mod:`karotte.sandbox.backend_client`) and the reference server
(:mod:`karotte.backend.server`, ``karotte backend serve``) over SQLite
(:mod:`karotte.backend.store`).
"""
