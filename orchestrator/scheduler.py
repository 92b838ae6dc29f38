"""The scheduler's public names, kept importable from here (the package is
``orchestrator.scheduling``, one small module per policy and part)."""
from orchestrator.scheduling import *  # noqa: F401,F403
from orchestrator.scheduling import __all__  # noqa: F401
