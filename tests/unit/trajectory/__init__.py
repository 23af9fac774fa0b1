"""Unit tests of gyre.trajectory."""
