"""The `scored_script` output source: scripted tokens, behaviour log-probs from the served weights
(equal to a transformers forward of prompt + script), weight updates reaching the scorer, and a
script file that starts over when `script_repeat` is on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from gyre.engine import EngineClient, EngineRequestError
from gyre.model.logprobs import token_logprobs
from gyre.model.tokenizer import Tokenizer
from gyre.model.weights import load_model
from services.cell_agent.engine import EngineServer
from tests.support.models import hf_dir
from tests.unit.engine.helpers import engine_section, engine_stats

CALL = '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.txt", "content": "8"}}\n</tool_call>'


async def test_scripted_tokens_carry_the_models_logprobs(tmp_path: Path) -> None:
    path = hf_dir("qwen3")
    tok = Tokenizer.from_dir(path)
    script = tmp_path / "script.jsonl"
    script.write_text("\n".join(json.dumps({"text": t}) for t in (CALL, "Done.")) + "\n")
    section = engine_section(output_source="scored_script", script_file=script, script_repeat=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = tok.encode("<|im_start|>user\nWrite 8 to a.txt<|im_end|>\n<|im_start|>assistant\n")
    async with EngineServer(section, model_dir=path) as engine, EngineClient(engine.url) as client:
        results = [
            await client.generate(prompt, {"max_new_tokens": 200, "temperature": t}) for t in (1.0, 0.7, 1.0)
        ]
        assert [tok.decode(r.output_ids, skip_special_tokens=False) for r in results] == [
            f"{CALL}<|im_end|>",
            "Done.<|im_end|>",
            f"{CALL}<|im_end|>",  # the file's entries, then again
        ]
        for r, t in zip(results, (1.0, 0.7, 1.0), strict=True):
            full = torch.tensor([[*prompt, *r.output_ids]])
            with torch.no_grad():
                logits = hf(full).logits[0]
            ref = token_logprobs(logits[len(prompt) - 1 : -1], torch.tensor(r.output_ids), t)
            assert float((torch.tensor(r.output_logprobs) - ref).abs().max()) <= 1e-4
        model = load_model(path)
        scaled = {n: p.detach() * 1.5 for n, p in model.named_parameters()}
        await client.update_weights_from_tensor(scaled, weight_version="1")
        after = await client.generate(prompt, {"max_new_tokens": 200})
        assert after.output_ids == results[1].output_ids and after.weight_version == "1"
        assert (
            float(
                (torch.tensor(after.output_logprobs) - torch.tensor(results[1].output_logprobs)).abs().max()
            )
            > 1e-3
        )
        with pytest.raises(EngineRequestError, match="unexpected"):
            await client.update_weights_from_tensor({"nope": torch.zeros(1)})
        # Scoring a prompt is a whole forward in a one-token step: never on the engine's event loop.
        assert (await engine_stats(client))["num_inline_steps"] == 0


def test_a_script_file_line_that_is_not_an_object_names_the_line(tmp_path: Path) -> None:
    script = tmp_path / "bad.jsonl"
    script.write_text('{"text": "a"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        EngineServer(engine_section(output_source="scripted", script_file=script), model_dir=hf_dir("qwen3"))
