"""`gyre model init | inspect | verify-template`: make, describe and check Hugging Face model directories.

    gyre model init --arch qwen3 --size tiny --out /tmp/qwen3-tiny      # random init + local BPE tokenizer
    gyre model inspect /tmp/qwen3-tiny                                   # architecture, parameters, dtype, ...
    gyre model verify-template /tmp/qwen3-tiny                           # is its chat template append-only?

A directory Gyre cannot use exits 2 with one line naming the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from gyre.model.arch import ModelError
from gyre.model.architectures import ARCHITECTURES

model_app = typer.Typer(help="Make, inspect and check Hugging Face model directories.", no_args_is_help=True)


def _fail(e: Exception) -> typer.Exit:
    typer.echo(f"error: {e}", err=True)
    return typer.Exit(2)


@model_app.command("init")
def init_cmd(
    out: Annotated[Path, typer.Option("--out", help="Directory to write (replaced if it exists).")],
    arch: Annotated[str, typer.Option(help=f"One of {', '.join(ARCHITECTURES)}.")] = "qwen3",
    size: Annotated[str, typer.Option(help="tiny (~2 M parameters) or small (~10 M).")] = "tiny",
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    tokenizer: Annotated[str, typer.Option(help="bpe (trained on Gyre's own text) or byte.")] = "bpe",
    family: Annotated[str | None, typer.Option(help="Chat family (default: the architecture's).")] = None,
    vocab_size: Annotated[
        int | None, typer.Option(help="BPE vocabulary incl. special tokens (8K-32K).")
    ] = None,
    context: Annotated[int | None, typer.Option(help="max_position_embeddings.")] = None,
) -> None:
    """Write a random-init model with a locally trained tokenizer and the family's chat template."""
    from gyre.model.init import init_model_dir

    try:
        path = init_model_dir(
            out,
            arch=arch,
            size=size,
            seed=seed,
            tokenizer=tokenizer,
            family=family,
            vocab_size=vocab_size,
            max_position_embeddings=context,
        )
    except (ValueError, ModelError) as e:
        raise _fail(e) from None
    typer.echo(json.dumps(inspect_dir(path)))


def inspect_dir(path: Path) -> dict[str, object]:
    from gyre.model.families import detect_family
    from gyre.model.files import check_model_dir
    from gyre.model.tokenizer import Tokenizer

    info = check_model_dir(path)
    tok = Tokenizer.from_dir(path)
    arch = info.arch
    try:
        family: str | None = detect_family(tok).name
    except ValueError:
        family = None
    return {
        "path": str(path),
        "architecture": arch.architecture,
        "num_parameters": arch.num_parameters(),
        "dtype": arch.dtype,
        "context_length": arch.max_position_embeddings,
        "vocab_size": arch.vocab_size,
        "tokenizer_vocab_size": tok.vocab_size,
        "template_family": family,
        "layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "heads": arch.num_heads,
        "kv_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "rope": {k: v for k, v in asdict(arch.rope).items() if v is not None},
        "moe": asdict(arch.moe) if arch.moe is not None else None,
        "policy_version": info.policy_version,
    }


@model_app.command("inspect")
def inspect_cmd(path: Annotated[Path, typer.Argument(help="Model directory.")]) -> None:
    """Print architecture, parameter count, dtype, context length and chat-template family (JSON)."""
    try:
        typer.echo(json.dumps(inspect_dir(path), indent=2))
    except ModelError as e:
        raise _fail(e) from None


@model_app.command("verify-template")
def verify_template_cmd(
    path: Annotated[Path, typer.Argument(help="Model directory whose chat template to check.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole report as one JSON line.")] = False,
) -> None:
    """Render multi-turn conversations turn by turn; exit 1 naming the first turn that is not append-only."""
    from gyre.trajectory.templates import TemplateError, template_for_model
    from gyre.trajectory.templates.verify import verify_template

    try:
        template = template_for_model(path, strict=False)
    except (ModelError, TemplateError, ValueError) as e:
        raise _fail(e) from None
    report = verify_template(template)
    data = {
        "template": template.name,
        "append_only": report.ok,
        "conversations": [
            {
                "name": c.name,
                "error": c.error or None,
                "turns": [asdict(t) for t in c.turns],
                "first_break": asdict(c.first_break) if c.first_break else None,
            }
            for c in report.conversations
        ],
    }
    if as_json:
        typer.echo(json.dumps(data))
    else:
        for c in report.conversations:
            marks = " ".join(("ok" if t.append_only else "BREAK") + f":{t.index}/{t.role}" for t in c.turns)
            typer.echo(f"{c.name}: {c.error or marks}")
    broken = report.first_break
    if broken is not None:
        name, turn = broken
        typer.echo(
            f"not append-only: {name!r}, turn {turn.index} ({turn.role}) rewrites earlier tokens from token "
            f"{turn.first_difference} ({turn.detail})",
            err=True,
        )
        raise typer.Exit(1)
    if not report.ok:
        raise typer.Exit(1)
    if not as_json:
        typer.echo("append-only: every render is a token prefix of the next")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
