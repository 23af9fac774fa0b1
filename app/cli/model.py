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
from typing import Annotated, Any

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
    """Render multi-turn conversations turn by turn with the directory's own chat template; exit 1 naming
    the first turn that is not append-only, and show what `proxy.template: auto` renders instead."""
    from gyre.trajectory.templates import TemplateError, template_for_model
    from gyre.trajectory.templates.verify import verify_template

    try:
        shipped = template_for_model(path, mode="shipped")
    except (ModelError, ValueError) as e:  # TemplateError included: a template that cannot render at all
        if not isinstance(e, TemplateError) or not path.is_dir():
            raise _fail(e) from None
        shipped, shipped_error = None, str(e)
    else:
        shipped_error = ""
    report = verify_template(shipped) if shipped is not None else None
    auto = _auto_report(path, shipped)
    data = {
        "template": shipped.name if shipped is not None else None,
        "append_only": report is not None and report.ok,
        "error": shipped_error or None,
        "conversations": [
            {
                "name": c.name,
                "error": c.error or None,
                "turns": [asdict(t) for t in c.turns],
                "first_break": asdict(c.first_break) if c.first_break else None,
            }
            for c in (report.conversations if report is not None else [])
        ],
        "auto": auto,
    }
    if as_json:
        typer.echo(json.dumps(data))
    else:
        _print_report(data)
    if report is None:
        typer.echo(f"not usable as it is: {shipped_error}", err=True)
        raise typer.Exit(1)
    broken = report.first_break
    if broken is not None:
        name, turn = broken
        typer.echo(
            f"not append-only: {name!r}, turn {turn.index} ({turn.role}) "
            + (
                f"rewrites earlier tokens from token {turn.first_difference} ({turn.detail})"
                if turn.first_difference is not None
                else turn.detail
            ),
            err=True,
        )
        raise typer.Exit(1)
    if not report.ok:
        raise typer.Exit(1)


def _auto_report(path: Path, shipped: Any) -> dict[str, Any]:
    """What `proxy.template: auto` renders with, and how its last-turn prompts compare to the shipped ones."""
    from gyre.trajectory.templates import VERIFIED, TemplateError, template_for_model
    from gyre.trajectory.templates.verify import compare_last_turns, verify_template

    try:
        auto = template_for_model(path, mode="auto")
    except (ModelError, ValueError, TemplateError) as e:
        return {"error": str(e)}
    substitution = auto.substitution
    if substitution is None:
        return {"template": auto.name, "source": "model"}
    return {
        "template": auto.name,
        "source": "registry",
        "family": substitution.family,
        "append_only": verify_template(auto).ok,
        "last_turn": [asdict(t) for t in compare_last_turns(shipped, auto)] if shipped is not None else [],
        "differences": VERIFIED[substitution.family].differences,
    }


def _print_report(data: dict[str, Any]) -> None:
    for c in data["conversations"]:
        marks = " ".join(
            ("ok" if t["append_only"] else "BREAK") + f":{t['index']}/{t['role']}" for t in c["turns"]
        )
        typer.echo(f"{c['name']}: {(c['error'] + ' | ') if c['error'] else ''}{marks}")
    auto = data["auto"]
    if data["append_only"]:
        typer.echo("append-only: every render is a token prefix of the next")
    elif "error" in auto:
        typer.echo(f"proxy.template: auto refuses it: {auto['error']}")
    elif auto["source"] == "registry":
        ok = "append-only" if auto["append_only"] else "NOT append-only"
        typer.echo(
            f"proxy.template: auto renders with the verified {auto['family']} template instead "
            f"({auto['template']}, {ok}); its prompt of each conversation's last assistant turn:"
        )
        for t in auto["last_turn"]:
            if t["equal"]:
                typer.echo(f"  {t['conversation']}: the same tokens as the model's own template")
            elif t["first_difference"] is None:
                typer.echo(f"  {t['conversation']}: {t['detail']}")
            else:
                typer.echo(
                    f"  {t['conversation']}: differs from token {t['first_difference']} ({t['detail']})"
                )


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
