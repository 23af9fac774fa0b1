"""The proxy service: harness-facing HTTP APIs (Anthropic, OpenAI), per-execution credentials, TITO
recording into trajectory trees, routing of calls to rollout engines and reroute on transitions."""
