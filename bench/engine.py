"""Benchmark of the embedded engine over real HTTP on a Hugging Face model: decode throughput against
`transformers`' own `generate`, batching gain, TTFT, prefix-cache and KV-import speedups, log-prob
exactness.

    gyre bench engine [--model DIR] [--threads N] [--decode-tokens N] [--long-prompt N] [--profile]

`--model` defaults to `gyre model init --arch qwen3 --size tiny` (1.8 M parameters). Prints one JSON
object (last line):
    hf_decode_tokens_per_s_b1 / _b16      engine: generated tokens per second, 1 / 16 concurrent requests
    transformers_generate_tokens_per_s_*  `model.generate` (sampling, KV cache) on the same prompts, same run
    vs_transformers_generate_b1 / _b16    engine / transformers (goal: >= 2 at b16, >= 1 at b1)
    vs_transformers_generate_cpu_b1 / _b16  the same in tokens per CPU-second of each side (the engine's
                                    process: HTTP client and server, scheduling, forward, sampling),
                                    which other processes on a shared machine disturb far less
    engine_step_cpu_ms_b16          CPU time of one b16 decode step's forward + sampling
    engine_compute_cpu_share_b16    that share of the engine process's CPU (the rest: HTTP, scheduling)
    load_avg_1m                     the machine's 1-minute load average at the start and at the end
    cpu_model / cpu_capability      the host's CPU and the vector ISA torch's kernels use on it (AVX2,
                                    AVX512): the ratios depend on it, so a figure names its machine
    profile_ops_b1 / _b16           --profile only: the torch ops the engine spent its CPU on (top 10,
                                    % of self CPU time), from torch.profiler over one decode run
    batching_gain_b16                     b16 / b1 (continuous batching; the goal is >= 3)
    ttft_ms_p50                     median time to the first streamed token, `ttft_prompt_tokens` prompt
    prefix_cache_hit_speedup        cold / warm time of a `long_prompt_tokens` prompt (1 output token)
    kv_import_vs_recompute_speedup  recompute time / (export + import + continue) time of a migrated request
    logprob_max_abs_err             max |engine log-prob - fresh full forward| over the b16 outputs
Rates and times are medians of three repetitions on whatever cores the machine lends; ratios are
the point, and engine and transformers alternate repetition by repetition so both see the same load.
Both sides run with `--threads` torch threads.

`--backend sglang,embedded,transformers` adds the real SGLang (`make setup`'s `.venv-sglang`, started on
this CPU as a cell agent starts it: services/cell_agent/engine_hosts) on the same model and prompts, after
the others, with the same client calls:
    sglang.decode_tokens_per_s_b1 / _b16  SGLang's generated tokens per second, 1 / 16 concurrent requests
    sglang.batching_gain_b16 / ttft_ms_p50 / logprob_max_abs_err (against a fresh full forward of the
                                    model in float32; `--sglang-dtype bfloat16` makes it the
                                    train/inference mismatch) / start_s / dtype
    embedded_vs_sglang_b1 / _b16    the embedded engine's rate / SGLang's
    transformers_vs_sglang_b1 / _b16  transformers' generate / SGLang's
SGLang's CPU path picks its own threads (all cores); the ratios say what each costs here, not which is
faster on a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench._startup import run_bench
from gyre.config.engine import EngineSection
from gyre.engine import EngineClient
from gyre.engine.migration import migrate_request_kv
from gyre.model.causal_lm import CausalLM
from gyre.model.init import init_model_dir
from gyre.model.logprobs import token_logprobs
from gyre.model.weights import load_model
from gyre.paths import REPO_ROOT
from services.cell_agent.engine import EngineServer

BACKENDS = {"embedded", "transformers", "sglang"}
VOCAB = 256  # prompts use the first 256 ids: bytes of the demo tokenizer, frequent merges of BPE ones


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@dataclass(frozen=True, slots=True)
class Rate:
    """Tokens generated in a timed run, its wall time and the CPU time of the side that generated them."""

    tokens: int
    wall_s: float
    cpu_s: float

    @property
    def per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def per_cpu_s(self) -> float:
        return self.tokens / self.cpu_s


def _transformers_rate(path: Path, batch: int, tokens: int, seed: int, threads: int) -> Rate:
    """`transformers`' own generate (sampling at temperature 1, its KV cache); CPU time of its thread."""
    import transformers

    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = torch.tensor([_prompt(32, seed + i) for i in range(batch)])
    kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "pad_token_id": 0}
    with torch.no_grad():
        model.generate(prompts[:1], max_new_tokens=8, min_new_tokens=8, **kwargs)  # warm-up
        start, cpu = time.perf_counter(), time.thread_time()
        out = model.generate(prompts, max_new_tokens=tokens, min_new_tokens=tokens, **kwargs)
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    return Rate((out.shape[1] - prompts.shape[1]) * batch, elapsed, cpu)


def _max_err(model: CausalLM, ids: list[int], output_ids: list[int], logprobs: list[float]) -> float:
    full = torch.tensor([*ids, *output_ids])
    with torch.no_grad():
        logits = model(full, torch.arange(len(full)), [0, len(full)])
    ref = token_logprobs(logits[len(ids) - 1 : len(ids) - 1 + len(output_ids)], torch.tensor(output_ids), 1.0)
    return float((torch.tensor(logprobs) - ref).abs().max())


async def _decode_rate(client: EngineClient, batch: int, tokens: int, seed: int) -> tuple[Rate, list[Any]]:
    """Engine decode of `batch` concurrent requests; CPU time of the whole process (the HTTP client
    and the engine serving it)."""
    params = {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 1.0}
    prompts = [_prompt(32, seed + i) for i in range(batch)]
    start, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(client.generate(p, params) for p in prompts))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    rate = Rate(sum(r.completion_tokens for r in results), elapsed, cpu)
    return rate, list(zip(prompts, results, strict=True))


async def _core_stats(client: EngineClient) -> dict[str, Any]:
    stats: dict[str, Any] = (await client.get_server_info())["internal_states"][0]
    return stats


async def _profile_ops(client: EngineClient, batch: int, tokens: int) -> list[list[Any]]:
    """The ops of one decode run under torch.profiler: [name, % of self CPU time], top 10."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        await _decode_rate(client, batch, tokens, seed=500)
    averages = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in averages) or 1.0
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    print(averages.table(sort_by="self_cpu_time_total", row_limit=20), file=sys.stderr)
    return [[e.key, round(100 * e.self_cpu_time_total / total, 1)] for e in top]


async def _ttft_ms(client: EngineClient, prompt_tokens: int, n: int) -> float:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        stream = client.generate_stream(_prompt(prompt_tokens, 1000 + i), {"max_new_tokens": 2})
        async for _ in stream:
            samples.append((time.perf_counter() - start) * 1000)
            break
        await stream.aclose()  # type: ignore[attr-defined]
    return statistics.median(samples)


async def _timed(client: EngineClient, ids: list[int]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await client.generate(ids, {"max_new_tokens": 1})
    return time.perf_counter() - start, result


async def _prefix_speedup(client: EngineClient, length: int, reps: int) -> float:
    ratios = []
    for i in range(reps):
        ids = _prompt(length, 2000 + i)
        cold, _ = await _timed(client, ids)
        warm, result = await _timed(client, ids)
        assert result.cached_tokens == length - 1, result.cached_tokens
        ratios.append(cold / warm)
    return statistics.median(ratios)


async def _import_speedup(
    source: EngineClient, destination: EngineClient, length: int, reps: int
) -> dict[str, float]:
    ratios, transfer_ms, recompute_ms = [], [], []
    for i in range(reps):
        ids = _prompt(length, 3000 + i)
        rid = f"migrate-{i}"
        steps_before = (await source.get_server_info())["internal_states"][0]["num_steps"]
        task = asyncio.create_task(source.generate(ids, {"max_new_tokens": 400, "ignore_eos": True}, rid=rid))
        while (await source.get_server_info())["internal_states"][0]["num_steps"] < steps_before + 3:
            await asyncio.sleep(0.005)  # prefilled and decoding on the source
        start = time.perf_counter()
        moved = await migrate_request_kv(source, destination, rid)
        moved_s = time.perf_counter() - start
        first = await task
        continued = [*ids, *first.output_ids]
        resume_s, resumed = await _timed(destination, continued)
        assert resumed.cached_tokens == moved.num_tokens > 0, (resumed.cached_tokens, moved)
        await destination.flush_cache()
        recompute_s, recomputed = await _timed(destination, continued)
        assert recomputed.cached_tokens == 0
        ratios.append(recompute_s / (moved_s + resume_s))
        transfer_ms.append(moved_s * 1000)
        recompute_ms.append(recompute_s * 1000)
        await destination.flush_cache()
    return {
        "kv_import_vs_recompute_speedup": statistics.median(ratios),
        "kv_migrate_ms": statistics.median(transfer_ms),
        "kv_recompute_ms": statistics.median(recompute_ms),
    }


async def run(
    path: Path,
    threads: int,
    decode_tokens: int,
    long_prompt: int,
    profile: bool,
    sglang_dtype: str | None = None,
) -> dict[str, Any]:
    load_start = os.getloadavg()[0]
    model = load_model(path)
    section = EngineSection(num_threads=threads, max_batch_size=32, kv_cache_tokens=65536)
    async with (
        EngineServer(section, model_dir=path, model=model) as engine,
        EngineServer(section, model_dir=path, model=model) as peer,
        EngineClient(engine.url) as client,
        EngineClient(peer.url) as peer_client,
    ):
        await _decode_rate(client, 4, 16, seed=0)  # warm-up
        # Engine and transformers alternate, repetition by repetition, so both see the same load.
        engine_b1: list[Rate] = []
        hf_b1s: list[Rate] = []
        hf_b16s: list[Rate] = []
        runs_b16 = []
        steps_b16, compute_b16 = 0, 0.0
        for i in range(3):
            engine_b1.append((await _decode_rate(client, 1, decode_tokens, seed=10 + i))[0])
            hf_b1s.append(
                await asyncio.to_thread(_transformers_rate, path, 1, decode_tokens, 10 + i, threads)
            )
            before = await _core_stats(client)
            runs_b16.append(await _decode_rate(client, 16, decode_tokens, seed=100 + 16 * i))
            after = await _core_stats(client)
            steps_b16 += after["num_steps"] - before["num_steps"]
            compute_b16 += after["compute_cpu_s"] - before["compute_cpu_s"]
            hf_b16s.append(
                await asyncio.to_thread(_transformers_rate, path, 16, decode_tokens, 100 + 16 * i, threads)
            )
        rates_b16 = [rate for rate, _ in runs_b16]
        outputs = [pair for _, pairs in runs_b16 for pair in pairs]
        err = max(_max_err(model, p, r.output_ids, r.output_logprobs) for p, r in outputs)
        ttft = await _ttft_ms(client, 512, 9)
        prefix = await _prefix_speedup(client, long_prompt, 3)
        migration = await _import_speedup(client, peer_client, long_prompt, 3)
        profiled = (
            {
                "profile_ops_b1": await _profile_ops(client, 1, decode_tokens),
                "profile_ops_b16": await _profile_ops(client, 16, decode_tokens),
            }
            if profile
            else {}
        )

    def median(rates: list[Rate], per_cpu: bool = False) -> float:
        return statistics.median(r.per_cpu_s if per_cpu else r.per_s for r in rates)

    rate_b1, rate_b16 = median(engine_b1), median(rates_b16)
    hf_b1, hf_b16 = median(hf_b1s), median(hf_b16s)
    versus: dict[str, Any] = {}
    if sglang_dtype is not None:
        sglang = await _sglang(path, model, decode_tokens, sglang_dtype)
        versus = {
            "sglang": sglang,
            "embedded_vs_sglang_b1": round(rate_b1 / sglang["decode_tokens_per_s_b1"], 2),
            "embedded_vs_sglang_b16": round(rate_b16 / sglang["decode_tokens_per_s_b16"], 2),
            "transformers_vs_sglang_b1": round(hf_b1 / sglang["decode_tokens_per_s_b1"], 2),
            "transformers_vs_sglang_b16": round(hf_b16 / sglang["decode_tokens_per_s_b16"], 2),
        }
    return {
        "hf_decode_tokens_per_s_b1": round(rate_b1, 1),
        "hf_decode_tokens_per_s_b16": round(rate_b16, 1),
        "transformers_generate_tokens_per_s_b1": round(hf_b1, 1),
        "transformers_generate_tokens_per_s_b16": round(hf_b16, 1),
        "vs_transformers_generate_b1": round(rate_b1 / hf_b1, 2),
        "vs_transformers_generate_b16": round(rate_b16 / hf_b16, 2),
        "vs_transformers_generate_cpu_b1": round(median(engine_b1, True) / median(hf_b1s, True), 2),
        "vs_transformers_generate_cpu_b16": round(median(rates_b16, True) / median(hf_b16s, True), 2),
        "engine_step_cpu_ms_b16": round(1000 * compute_b16 / max(steps_b16, 1), 3),
        "engine_compute_cpu_share_b16": round(compute_b16 / sum(r.cpu_s for r in rates_b16), 3),
        "batching_gain_b16": round(rate_b16 / rate_b1, 2),
        "ttft_ms_p50": round(ttft, 2),
        "ttft_prompt_tokens": 512,
        "prefix_cache_hit_speedup": round(prefix, 2),
        "long_prompt_tokens": long_prompt,
        "kv_import_vs_recompute_speedup": round(migration["kv_import_vs_recompute_speedup"], 2),
        "kv_migrate_ms": round(migration["kv_migrate_ms"], 2),
        "kv_recompute_ms": round(migration["kv_recompute_ms"], 2),
        "logprob_max_abs_err": err,
        "torch_threads": threads,
        "decode_tokens": decode_tokens,
        "model": model.arch.architecture,
        "model_parameters": model.arch.num_parameters(),
        "load_avg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "regime": "CPU, embedded engine in-process over loopback HTTP",
        **profiled,
        **versus,
    }


async def _sglang(path: Path, model: CausalLM, decode_tokens: int, dtype: str) -> dict[str, Any]:
    """The real SGLang on this CPU, started as a cell agent starts it, measured with the same calls."""
    from services.cell_agent.engine_hosts import create_engine_host

    python = REPO_ROOT / ".venv-sglang" / "bin" / "python"
    if not python.is_file():
        raise SystemExit(
            f"gyre bench engine: SGLang is not installed ({python} is missing): run `make setup`"
        )
    section = EngineSection(
        backend="sglang",
        sglang_device="cpu",
        sglang_python=str(python),
        dtype=dtype,
        max_batch_size=32,
        kv_cache_tokens=32768,
    )
    host = create_engine_host(section, path)
    t0 = time.perf_counter()
    await host.start()
    start_s = time.perf_counter() - t0
    try:
        async with EngineClient(host.url, timeout_s=600) as client:
            await _decode_rate(client, 4, 16, seed=0)  # warm-up
            b1 = [(await _decode_rate(client, 1, decode_tokens, seed=10 + i))[0] for i in range(3)]
            runs_b16 = [await _decode_rate(client, 16, decode_tokens, seed=100 + 16 * i) for i in range(3)]
            ttft = await _ttft_ms(client, 512, 9)
            version = await client.get_server_info()
    finally:
        await host.stop()
    outputs = [pair for _, pairs in runs_b16 for pair in pairs]
    err = max(_max_err(model, p, r.output_ids, r.output_logprobs) for p, r in outputs)
    rate_b1 = statistics.median(r.per_s for r in b1)
    rate_b16 = statistics.median(r.per_s for r, _ in runs_b16)
    return {
        "decode_tokens_per_s_b1": round(rate_b1, 1),
        "decode_tokens_per_s_b16": round(rate_b16, 1),
        "batching_gain_b16": round(rate_b16 / rate_b1, 2),
        "ttft_ms_p50": round(ttft, 2),
        "logprob_max_abs_err": err,
        "dtype": dtype,
        "start_s": round(start_s, 1),
        "version": version.get("version"),
        "regime": "CPU, SGLang server process (--device cpu --attention-backend torch_native) over loopback HTTP",
    }


def _cpu_model() -> str | None:
    """The first `model name` of /proc/cpuinfo (None where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench engine", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="HF model directory (default: a tiny Qwen3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the engines")
    parser.add_argument("--decode-tokens", type=int, default=256, help="tokens generated per request")
    parser.add_argument("--long-prompt", type=int, default=2048, help="prompt tokens of the cache/KV runs")
    parser.add_argument(
        "--profile", action="store_true", help="also profile one b1 and one b16 decode run (torch.profiler)"
    )
    parser.add_argument(
        "--backend",
        default="embedded,transformers",
        help="comma-separated: embedded and transformers (always measured), sglang (the real server)",
    )
    parser.add_argument("--sglang-dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args(argv)
    backends = {b.strip() for b in args.backend.split(",") if b.strip()}
    if not backends <= BACKENDS:
        parser.error(
            f"--backend: {', '.join(sorted(backends - BACKENDS))} is not one of {', '.join(sorted(BACKENDS))}"
        )

    async def body(work: Path) -> dict[str, Any]:
        path = args.model or init_model_dir(work / "qwen3-tiny", arch="qwen3", size="tiny")
        sglang_dtype = args.sglang_dtype if "sglang" in backends else None
        return await run(path, args.threads, args.decode_tokens, args.long_prompt, args.profile, sglang_dtype)

    run_bench("engine", body)


if __name__ == "__main__":
    main(sys.argv[1:])
