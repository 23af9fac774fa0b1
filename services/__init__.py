"""Gyre's services, one package each: scheduler, proxy, runner, evaluator, packer, cell_agent.

Importing the package turns gRPC's fork handlers off for the process, before grpc loads (`python -m
services.<name>` imports this first): services fork only to exec (sandboxes, verifiers, SGLang), which
needs no handlers, and with them gRPC's C core writes plain-text lines ("skipping fork() handlers", epoll
errors) into the service's JSON log on every fork.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
