"""``karotte build``, ``karotte base``, ``karotte clean``."""
