"""Model directories in and out: what `check_model_dir` refuses (one line naming the file and the
field), and written directories loading back in Gyre and in transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from gyre.model.arch import ModelError
from gyre.model.files import INDEX_FILE, WEIGHTS_FILE, check_model_dir
from gyre.model.weights import load_model, load_state_dict, write_model_dir
from tests.support.models import copy_dir, hf_dir, small_dir


def _refused(path: Path) -> ModelError:
    with pytest.raises(ModelError) as info:
        check_model_dir(path)
    assert "\n" not in str(info.value)
    return info.value


def test_an_unsupported_architecture_names_config_json(tmp_path: Path) -> None:
    path = copy_dir(small_dir(), tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    error = _refused(path)
    assert error.field == "architectures" and error.path == str(path / "config.json")


def test_a_directory_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    path = copy_dir(small_dir(), tmp_path / "m")
    (path / "tokenizer.json").unlink()
    error = _refused(path)
    assert error.field == "tokenizer.json" and error.path == str(path / "tokenizer.json")


def test_a_truncated_safetensors_file_names_the_tensor(tmp_path: Path) -> None:
    path = copy_dir(small_dir(), tmp_path / "m")
    weights = path / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-100])
    error = _refused(path)
    assert error.path == str(weights) and "truncated" in str(error) and error.field.startswith("model.")


def test_a_shape_that_disagrees_with_config_json_names_the_tensor(tmp_path: Path) -> None:
    path = copy_dir(small_dir(), tmp_path / "m")
    tensors = load_state_dict(check_model_dir(path))
    tensors["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(8, 32)
    write_model_dir(path, arch=check_model_dir(small_dir()).arch, tensors=tensors, source=small_dir())
    error = _refused(path)
    assert error.field == "model.layers.1.self_attn.k_proj.weight" and "disagrees with config.json" in str(
        error
    )


def test_a_missing_or_unknown_tensor_is_named(tmp_path: Path) -> None:
    arch = check_model_dir(small_dir()).arch
    tensors = load_state_dict(check_model_dir(small_dir()))
    missing = {k: v for k, v in tensors.items() if k != "model.norm.weight"}
    assert (
        _refused(write_model_dir(tmp_path / "a", arch=arch, tensors=missing, source=small_dir())).field
        == "model.norm.weight"
    )
    extra = {**tensors, "model.layers.0.mlp.extra.weight": torch.zeros(2)}
    assert _refused(
        write_model_dir(tmp_path / "b", arch=arch, tensors=extra, source=small_dir())
    ).field.endswith("extra.weight")


def test_a_written_directory_loads_in_transformers_and_back(tmp_path: Path) -> None:
    model = load_model(hf_dir("qwen3"))
    named = {n: p.detach() * 1.5 for n, p in model.named_parameters()}
    out = write_model_dir(
        tmp_path / "pub",
        arch=model.arch,
        tensors=named,
        source=hf_dir("qwen3"),
        metadata={"gyre_policy_version": "7"},
    )
    info = check_model_dir(out)
    assert (
        info.policy_version == 7
        and (out / "tokenizer.json").is_file()
        and (out / "generation_config.json").is_file()
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    reloaded = load_model(out)
    ids = torch.randint(0, model.arch.vocab_size, (40,))
    with torch.no_grad():
        assert (reloaded(ids, torch.arange(40), [0, 40]) - hf(ids[None]).logits[0]).abs().max() <= 1e-5
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith(
        "<|im_start|>user"
    )


def test_sharded_directories_round_trip(tmp_path: Path) -> None:
    model = load_model(small_dir())
    out = write_model_dir(
        tmp_path / "sharded",
        arch=model.arch,
        tensors=dict(model.named_parameters()),
        source=small_dir(),
        max_shard_bytes=20_000,
    )
    assert (out / INDEX_FILE).is_file() and not (out / WEIGHTS_FILE).exists()
    assert len({p.name for p in out.glob("model-*.safetensors")}) > 2
    reloaded = dict(load_model(out).named_parameters())
    assert all(torch.equal(p, reloaded[n]) for n, p in model.named_parameters())
    (out / next(iter(sorted(out.glob("model-*.safetensors")))).name).unlink()
    assert "missing" in str(_refused(out))


def test_bf16_checkpoints_load_upcast(tmp_path: Path) -> None:
    model = load_model(small_dir())
    out = write_model_dir(
        tmp_path / "bf16",
        arch=model.arch,
        tensors=dict(model.named_parameters()),
        source=small_dir(),
        dtype="bfloat16",
    )
    info = check_model_dir(out)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {e.dtype for e in info.tensors.values()} == {"bfloat16"}
    loaded = load_model(out)
    assert loaded.model.norm.weight.dtype == torch.float32
    want = model.model.embed_tokens.weight.detach().to(torch.bfloat16).float()
    assert torch.equal(loaded.model.embed_tokens.weight.detach(), want)
