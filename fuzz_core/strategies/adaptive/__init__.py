"""CDeepFuzz's own strategy: a loop over a short list of named tactics (see :mod:`.core` and :mod:`.tactics`).

Each iteration, a tactic that holds the site takes its next step (a ride of the program's training, an
escape walk, a pending re-measurement); otherwise the tactics propose points in turn (Polyak steps that
land on the edge, interesting values) until one lowers the margin; a round in which none
does is answered by the first tactic that reacts (freeze the training that fights the search, ride the
training when the edge is out of the box's reach, walk out of a local minimum).
:class:`AdaptiveOptions` holds the settings a user may change; ``docs/adaptive-ablation.md`` measures what
each tactic and setting earns over the repository's whole subject set.
"""
from fuzz_core.strategies.adaptive.core import Adaptive, AdaptiveOptions, Context, Tactic
from fuzz_core.strategies.adaptive.tactics import (
    DEFAULT_TACTICS, Escape, Exact, Freeze, Land, Ride, Steer,
)

__all__ = ["DEFAULT_TACTICS", "Adaptive", "AdaptiveOptions", "Context", "Escape", "Exact", "Freeze",
           "Land", "Ride", "Steer", "Tactic"]
