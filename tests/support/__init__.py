"""Test support shared across test packages."""
