"""The embedded model: a byte-level tokenizer and a small decoder-only transformer in plain torch.

Used by the embedded rollout engine and by the torch trainer, so parameter names are stable.
This package file imports nothing, so `gyre.model.tokenizer` stays importable without torch:

    from gyre.model.config import ModelConfig
    from gyre.model.transformer import GyreLM, build_model
    from gyre.model.checkpoint import save_checkpoint, load_checkpoint
    from gyre.model.logprobs import token_logprobs
"""
