"""Benchmarks, run with `gyre bench NAME`. Each module defines `main(argv)` and prints one JSON
object as its last line. Quote medians and ratios measured in the same run."""
