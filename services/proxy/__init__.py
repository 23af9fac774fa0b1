"""The proxy service: harness-facing HTTP APIs (Anthropic Messages, OpenAI Chat Completions and
Responses), per-execution credentials, TITO recording into trajectory trees kept in Redis,
routing of calls to rollout engines and transparent reroute when an engine is drained.

    python -m services.proxy --config runs/<run>/config.yaml

Layout: app.py (HTTP routes) → api.py (the request driver) → {anthropic,chat,responses}_api.py
and *_sse.py (wire formats) → calls.py (the TITO path of one call) → generation.py (engine
attempts) + routing.py (routes, drain); executions.py, credentials.py, gyre/store/trees.py
(state); grpc_api.py (control plane); core.py wires them, service.py is the shell.
"""
