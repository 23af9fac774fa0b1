"""The embedded model: a byte-level tokenizer and a small decoder-only transformer in plain torch.

Used by the embedded rollout engine and by the torch trainer, so parameter names are stable.
"""
