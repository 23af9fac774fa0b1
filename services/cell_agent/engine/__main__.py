"""Run the embedded engine as its own process until SIGINT/SIGTERM.

    python -m services.cell_agent.engine --config gyre.yaml [--port 0]

Prints one JSON line `{"url": ...}` on stdout once it serves (port 0 picks a free port); logs go to
stderr. A config or model directory it cannot use exits 2 with one line naming the field.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gyre.config import EngineSection


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m services.cell_agent.engine", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", type=Path, default=None, help="Gyre YAML config (defaults if omitted)")
    parser.add_argument("--port", type=int, default=None, help="override cell_agent.engine.port")
    args = parser.parse_args(argv)

    from gyre.config import load_config
    from gyre.errors import StartupError
    from gyre.log import configure_logging
    from gyre.model.model_dir import ModelDir

    try:
        config = load_config(args.config)
        section = config.cell_agent.engine
        if args.port is not None:
            section = section.model_copy(update={"port": args.port})
        configure_logging(config.log.format, config.log.level)
        asyncio.run(_serve(section, ModelDir.open(config.model).path))
    except StartupError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


async def _serve(section: EngineSection, model_dir: Path) -> None:
    from gyre.lifecycle import install_signal_handlers
    from services.cell_agent.engine.server import EngineServer

    stop = asyncio.Event()
    install_signal_handlers(stop)
    async with EngineServer(section, model_dir=model_dir) as engine:
        sys.stdout.write(json.dumps({"url": engine.url}) + "\n")
        sys.stdout.flush()
        await stop.wait()


if __name__ == "__main__":
    main()
