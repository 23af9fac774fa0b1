"""The demo harness: an agent loop that reaches the model only through ANTHROPIC_BASE_URL and an API key.

    python -m harness --prompt "3+5=? Write the answer to answer.txt."   # the runner starts it in a sandbox

    __main__.py   the entry point; one JSON report line at the end
    agent.py      the loop: model call → tools → results, compaction, sub-agents
    client.py     the official `anthropic` SDK with the harness's retries
    tools.py      bash, write_file, read_file, delegate
    prompts.py    its system prompts
    latency.py    seeded heavy-tailed tool sleeps

It imports nothing of Gyre (an import-linter contract). The demo model's tools, which do host Gyre's
engine and trainer, are in `demo_model/`.
"""
