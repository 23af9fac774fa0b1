"""The local stack: NATS and Redis servers plus every Gyre service as processes on 127.0.0.1.

`gyre up` / `gyre down` / `gyre status` drive it; tests reuse `servers` for hermetic brokers.
"""
