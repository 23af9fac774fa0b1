"""The shipped overlay `app/demo/sglang.yaml` is the packaged demo with every cell's engine on SGLang on
these CPUs: what `gyre demo --config app/demo/sglang.yaml` and tests/e2e/test_sglang_run.py run."""

from __future__ import annotations

from app.demo.config import demo_config, embedded_model_path
from gyre.engine.backends import served_context
from gyre.paths import REPO_ROOT

OVERLAY = REPO_ROOT / "app" / "demo" / "sglang.yaml"


def test_the_sglang_overlay_is_the_demo_on_cpu_sglang_servers() -> None:
    config = demo_config(OVERLAY, {})
    engine = config.cell_agent.engine
    assert (engine.backend, engine.sglang_device, engine.dtype) == ("sglang", "cpu", "float32")
    assert engine.sglang_python == str(
        REPO_ROOT / ".venv-sglang" / "bin" / "python"
    )  # where make setup puts it
    assert config.scheduler.num_cells == 3 and config.scheduler.mode == "elastic"
    assert config.model.path == embedded_model_path()  # the demo's warm start
    assert engine.max_batch_size >= config.scheduler.cell_capacity
    context = served_context(engine, embedded_model_path())
    assert context is not None and engine.kv_cache_tokens >= context  # what check_engine requires
    assert config.cell_agent.trainer.publication == "disk" and config.cell_agent.published_weights == "shared"
