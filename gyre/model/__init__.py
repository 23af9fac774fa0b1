"""Models: Hugging Face checkpoint directories in and out, and the decoder Gyre serves and trains.

One model path for the whole framework: a directory with config.json (`LlamaForCausalLM`,
`Qwen2ForCausalLM`, `Qwen3ForCausalLM`: `architectures/`), safetensors weights under their HF names, tokenizer.json +
tokenizer_config.json (chat template). This package file imports nothing, so light modules
(`arch`, `tokenizer`) stay importable without torch:

    from gyre.model.arch import ModelArch, ModelError, read_arch        # config.json, checked
    from gyre.model.architectures import ARCHITECTURES                   # one record per architecture
    from gyre.model.tokenizer import Tokenizer                           # tokenizer.json + chat template
    from gyre.model.files import check_model_dir
    from gyre.model.model_dir import ModelDir                            # model.path read once, at start
    from gyre.model.weights import load_model, write_model_dir
    from gyre.model.causal_lm import CausalLM                            # packed + paged forwards
    from gyre.model.attention import packed_attention                    # path rows and tree rows
    from gyre.model.tree_layout import TreeLayout                        # tree-packed rows' structure
    from gyre.model.init import init_model_dir                           # `gyre model init`
    from gyre.model.families import FAMILIES, detect_family              # chat formats and parsers
    from gyre.model.logprobs import token_logprobs
"""
