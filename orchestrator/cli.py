"""``python -m orchestrator.cli`` and the ``cdeepfuzz`` entry point: the CLI lives in
:mod:`orchestrator.commands.cli`."""
from orchestrator.phases import mark

mark("python start")        # the interpreter's start, up to the CLI's first import (--profile)
from orchestrator.commands.cli import app, main  # noqa: E402

__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
