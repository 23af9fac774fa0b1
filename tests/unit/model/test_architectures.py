"""Contract of the architecture registry, run for every name in `gyre.model.architectures.ARCHITECTURES`:
a directory made by `gyre model init --arch NAME` reads back as that record, its parameters are those
`ModelArch.parameter_shapes` names, transformers builds the same model from it, and its chat template is
the record's chat family. (Logits against transformers: tests/unit/model/test_causal_lm.py, per name too.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from gyre.model.arch import read_arch
from gyre.model.architectures import ARCHITECTURES, HF_CLASSES, by_hf_class
from gyre.model.families import FAMILIES, detect_family
from gyre.model.tokenizer import Tokenizer
from gyre.model.weights import load_model
from tests.support.models import hf_dir, written_names


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_an_initialized_directory_reads_back_as_its_record(name: str) -> None:
    record = ARCHITECTURES[name]
    arch = read_arch(hf_dir(name))
    assert arch.architecture == record.hf_class and by_hf_class(record.hf_class) is record
    assert arch.raw["model_type"] == record.model_type
    switches = record.switches(lambda key: bool(arch.raw.get(key, False)))
    assert (arch.qkv_bias, arch.o_bias, arch.mlp_bias, arch.qk_norm) == (
        switches.qkv_bias,
        switches.o_bias,
        switches.mlp_bias,
        switches.qk_norm,
    )


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_parameters_are_named_as_the_arch_says_and_transformers_builds_it(name: str, tmp_path: Path) -> None:
    path = hf_dir(name)
    ours = load_model(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert type(theirs).__name__ == ARCHITECTURES[name].hf_class
    shapes = {n: tuple(p.shape) for n, p in ours.named_parameters()}
    assert shapes == ours.arch.parameter_shapes()
    assert written_names(theirs, tmp_path / "saved") == set(shapes)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_the_chat_family_is_registered_and_recognized(name: str) -> None:
    family = ARCHITECTURES[name].chat_family
    assert family in FAMILIES
    assert detect_family(Tokenizer.from_dir(hf_dir(name))).name == family


def test_names_and_classes_are_unique() -> None:
    assert len(set(HF_CLASSES)) == len(HF_CLASSES) == len(ARCHITECTURES)
    assert all(name == record.name for name, record in ARCHITECTURES.items())
