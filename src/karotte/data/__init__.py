"""Data files shipped with Karotte (the model catalog)."""
