"""Local HTTP stub servers that stand in for paid model APIs in tests."""
