"""A drift step that neither trained nor moved the inputs is one the next step repeats: the
adaptive strategy refreshes samples at once instead of waiting for its periodic refresh."""
import numpy as np

from fuzz_core.backends.base import Evaluation
from fuzz_core.strategies.adaptive import _stuck


def _ev(trained: bool) -> Evaluation:
    return Evaluation(seen=True, hard=1.0, log_loss=1.0, triggered=False, event=False, trained=trained)


def test_untrained_step_that_left_the_inputs_in_place_is_stuck():
    x = {"x": np.zeros((2, 3), np.float32)}
    assert _stuck(_ev(False), x, dict(x))
    assert _stuck(_ev(False), x, {"x": np.zeros((2, 3), np.float32)})   # equal values, a new array


def test_a_step_that_trained_or_moved_is_not_stuck():
    x = {"x": np.zeros((2, 3), np.float32)}
    assert not _stuck(_ev(True), x, dict(x))                            # the weights moved
    moved = {"x": np.full((2, 3), 0.15, np.float32)}
    assert not _stuck(_ev(False), x, moved)                             # the inputs moved
