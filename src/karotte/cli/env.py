"""``karotte create-env``, ``karotte templates list``, ``karotte update``."""
