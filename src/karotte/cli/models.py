"""``karotte models list`` (the model catalog)."""
