"""The demo harness (an agent loop that reaches the model only through ANTHROPIC_BASE_URL) and its tasks."""
