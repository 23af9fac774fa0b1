"""The evaluator service: scores preserved workspaces after every termination and marks groups ready."""
