"""The app: what starts and drives Gyre's services — the `gyre` command (`cli/`), the local stack of
supervised processes (`stack/`), the demo run and its report (`demo/`), and the audit of a finished run
(`audit/`). It sits above `services/` and the library `gyre/` and imports only them; the benchmarks and the
simulator sit above it (`gyre` loads their command groups as entry points, docs/design.md "Layers").

    gyre --help
"""
