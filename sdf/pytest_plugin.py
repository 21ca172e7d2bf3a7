"""pytest plugin entry point for SDF testing fixtures (issue 7; none registered yet)."""
