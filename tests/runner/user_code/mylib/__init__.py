"""The user's own package, next to the main script (not installed anywhere)."""
