"""The trajectory processor: message model, chat templates, TITO trees, admission, rows.

Pure library code: imports nothing from grpc, nats, redis or HTTP stacks (a test enforces it).
"""
