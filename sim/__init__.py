"""Discrete-event cluster simulator driven by the scheduler's policy code (`gyre sim`)."""
