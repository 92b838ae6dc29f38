"""``python -m orchestrator.cli`` and the ``cdeepfuzz`` entry point: the CLI lives in
:mod:`orchestrator.commands.cli`."""
from orchestrator.commands.cli import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
