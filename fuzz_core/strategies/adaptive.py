"""CDeepFuzz's own strategy: Polyak steps that land on the boundary, then finish the job.

Each iteration proposes, in order, until one lowers the hard-minimum margin:

1. a Polyak step ``(L - L*) / |g|^2 * g`` in the space that suits the op: in log
   space for quantities that approach their edge multiplicatively (a softmax or
   sigmoid output, a sum of exps: ``log p`` is nearly linear in the logits, so one
   step reaches the underflow), in the op's input space otherwise, aiming past the
   edge (``overshoot``) for hazards that are crossed, exactly onto it for hazards
   at a point (a zero divisor). The step is solved inside the box (bounds), so
   clipping does not eat it;
2. the same step in the other space, then shorter steps (backtracking);
3. a sign step when the gradient vanishes; after an iteration without progress, a
   short walk of unconditional sign steps (GRIST's move) out of the local minimum;
4. a quasi-Newton step (L-BFGS from the curvature of the accepted steps) when plain
   Polyak steps make slow progress: a margin such as ``1 - cos`` of two embeddings
   is a narrow valley through a network, where gradient steps zig-zag and a
   curvature-aware step goes down it (an ArcFace head: a few dozen steps instead of never);
   tried first while progress is slow, and after the Polyak steps once such a first try was
   rejected, until a quasi-Newton step is accepted again (:data:`QN_DEMOTE`);
5. mutations to interesting values: the weakest sample set to 0, to a copy of
   another sample, to its own mean (equal features), to the bounds, to +-1; with
   searched weights, the weights the hard minimum depends on set to 0.
   Floating point is discrete: a gradient step rarely lands *exactly* on a zero
   divisor or makes two vectors exactly parallel; these values do.

In a program that trains, the first failed list of a point re-measures that point: when the
training steps on the tried batches took back most of the search's progress (a hazard on the
loss itself, which training lowers), the site goes on from its start state with its training
steps undone after each step (:meth:`SiteSearch.freeze`); when, from there, no input in the box
reaches the edge, it thaws and rides the training after all (:data:`THAW`). When the training took
back less, the point is measured at the factory's weights too, and the site goes on frozen there when
it is nearer the edge there and the edge within the box's reach (:data:`RECHECK_FACTORY`), where it tries
the list's first step before its mutations (:data:`REFIT`). A first point whose edge is out of the
box's reach under the linear model rides the training once its full steps failed, without the
shorter steps, the sign step and the mutations (:data:`FIRST_CUT`). A site that starts to ride the program's
training (:meth:`Adaptive._drift`) first measures one training step from the factory's state on its
point, and rides from whichever state leaves the lower margin: today's weights were trained on every
batch the search tried. The ride keeps the randomness the point was measured under (dropout masks,
noise: :data:`DRIFT_CRN`), so that each of its steps measures the same network; a new draw per step
measured another network each time, and a point the search had made was lost in the noise. A drift
given up for want of progress rides once more from the factory's state (:data:`RIDE_AGAIN`); once that
ride gives up too, every third list that fails whole, or crawl of slow steps (:data:`RIDE_CRAWL`), starts
a ride from today's weights (:data:`RIDE_ON`), GRIST's way: on the program's own data, the point's weakest
row kept at the start, by the margin's gradient alone, rows refreshed at random (:data:`RIDE_REAL`).

A site that stalls refreshes its least important samples (importance: how far each
sample's suspect loss moved). Every forward pass counts as a step. Candidates are
compared under the same randomness of the program (dropout masks, noise: common
random numbers), drawn anew at each refresh.
"""
from __future__ import annotations

import hashlib
import math
import zlib
from typing import Iterator

import numpy as np

from fuzz_core.backends.base import WEIGHT_PREFIX, Evaluation
from fuzz_core.strategies.base import (
    Strategy, box_step, importance, note_reachability, refresh_samples, sign_step,
)

OVERSHOOT = 0.5          # linear steps aim this fraction of the margin past a crossed edge
BACKTRACK = (0.5, 0.2, 0.05)  # shorter steps along the first proposal, after the full ones
SIGN_FRACTION = 0.1      # sign-step size, as a fraction of each value's box
STALL_REFRESH = 3        # iterations without progress before a refresh
ESCAPE_STEPS = 12        # unconditional sign steps after an iteration without progress
ESCAPE_FRACTION = 0.025  # their size, as a fraction of each value's box
REFRESH_FRACTION = 0.25
# jitter first (near a rounding-decided edge it is the cheapest win) and drawn again at the end:
# each draw is a new ticket in the rounding lottery
MUTATIONS = ("jitter", "zero", "copy", "flat", "low", "high", "one", "minus_one", "jitter", "jitter", "jitter",
             "support")
# tried at the first point, after the first gradient step, where the edge is a point that the
# search must land on exactly (a zero divisor; a backward hazard: the sqrt of a variance at exactly
# 0): a margin such as a variance only reaches 0 when values are exactly equal, which gradient
# steps approach and never reach (in float32 a variance stops near 1e-14, not at 0)
EARLY_MUTATIONS = ("support", "zero", "flat")
# "support" (searched weights only): the weights the hard minimum depends on (its gradient's nonzero
# entries) set to 0: a divisor that is a sum of weights (a column sum of |w|) or a weight itself (a
# gain) is exactly 0 there, where a gradient step overshoots each entry and lands on none
MULT_MIN, MULT_MAX = 0.1, 8.0   # bounds of the input-space step multiplier
JITTER = 1e-6            # relative size of the rounding-lottery perturbation
QN_MEMORY = 8            # curvature pairs kept by the quasi-Newton (L-BFGS) proposal
QN_MAX_SIZE = 1 << 20    # searched elements above which it is not used (memory: 2 * QN_MEMORY copies)
MAX_TIES = 4             # consecutive gradient steps accepted on an unchanged (quantised) margin
NONMONOTONE = 3          # a tie is measured against the largest of this many accepted margins
TIE_RATIO = 16.0         # ... and at most this many times the current one (a few ulps of a quantised margin)
SLOW = 0.5               # an accepted step that kept more than this fraction of the margin was slow
RECHECKS = 2             # re-measurements of the current point, per site, of a program that trains
UNDONE = 0.5             # training that took back more than this share of the search's progress fights it
# riding the program's training (a bug that training reaches: no input in the box crosses at today's weights)
DRIFT_FRACTION = 0.15    # step per coordinate, as a fraction of its box (GRIST's 0.15 on [0, 1] pixels)
DRIFT_REFRESH = 100      # drift steps between refreshes of the least important samples (GRIST's rhythm)
DRIFT_REFRESH_FRACTION = 0.05
DRIFT_PATIENCE = 200     # drift steps without a margin below the lowest the drift has measured: drifting is given up
DRIFT_AFTER = 8          # slow accepted points in a row before a site with the edge out of the box's reach drifts
DRIFT_CRAWL = 12         # slow accepted points in a row before a site that trains drifts, edge in reach or not
DRIFT_ARMS = ("both", "row", "grad")   # the lookahead on every sample, on the weakest one, or none
DRIFT_PHASE = 10         # drift steps a direction rule is tried for at a time
DRIFT_EXPLORE = 5        # every this many phases, the rule left untried longest
RESTART = True           # a site's first drift measures the training from the factory's state (_restart)
RESTART_PASSES = 2       # ... in this many evaluations: the factory's step on the point, and the margin it leaves
RESTART_AFTER = 16       # ... once the search has taken this many steps (fewer: its batches barely moved the weights)
THAW = True              # a frozen site with the edge out of the box's reach at the factory's weights rides the training
QN_DEMOTE = True         # a quasi-Newton step tried first and rejected goes after the Polyak steps until one is accepted
DRIFT_CRN = True         # a drift (and its restart) keeps the randomness its point was measured under
DEDUPE = True            # a list of mutations proposes each batch once (kinds that coincide in the box, repeats)
FIRST_CUT = True         # a first point whose edge is out of the box's reach skips the shorter steps and sign step
STUCK_REFRESH = True     # a drift step that neither trained nor moved the inputs refreshes samples at once
RECHECK_FACTORY = True   # a re-measured point that lost ground is measured at the factory's weights too
RIDE_AGAIN = True        # a drift given up rides once more, from the factory's state under a new draw, by GRIST's rule
SLOW_START = True        # a point only slow steps led to counts as the first point for riding the training at once
ESCAPE_STUCK = True      # a walk whose sign step leaves every input where it was, and nothing trains, ends there
REFIT = True             # a point moved to the factory's weights tries the list's first step from there (log-space ops)
RIDE_ON = 3              # failed lists after a site's rides gave up for good before it rides again (0: never)
RIDE_CRAWL = True        # ... and so does a crawl of DRIFT_CRAWL slow points, which is no failed list and never ends
RIDE_REAL = True         # a ride on (RIDE_ON) goes GRIST's way: real data, the margin's gradient, rows refreshed at random
REAL_PATIENCE = 1000     # ... given up after this many drift steps without a new low


class Adaptive(Strategy):
    name = "adaptive"
    refresh_fraction = REFRESH_FRACTION

    def iterate(self, s) -> None:
        cur: Evaluation | None = s.cache.get("current")
        st = s.strategy_state
        if st.get("drift"):
            self._drift(s)
            return
        # "open": a quantum ended inside the list of proposals, which goes on before any escape
        if cur is not None and st.get("escape", 0) > 0 and not st.get("open", False):
            self._escape(s, cur)
            return
        if cur is None:
            st["seed_step"] = s.step          # candidates share this step's randomness until a refresh
            cur = s.evaluate(s.values, seed_step=st["seed_step"])
            note_reachability(s, cur)
            st.setdefault("origin", float(cur.hard))     # the site's first margin: what progress is measured from
            self._accept(s, s.values, cur, "step")
            if s.unreachable:
                return
        if st.get("probe"):
            self._probe(s, cur)
            return
        if not st.get("open") and st.get("slow_run", 0) >= DRIFT_CRAWL:
            if self._may_drift(s, cur):
                self._start_drift(s, "crawl", cur)  # a long crawl toward an edge within reach: sign steps beat it
                return
            if RIDE_CRAWL and st.get("drift_done"):
                st["slow_run"] = 0              # a crawl after the rides gave up counts as a list that failed
                if self._rides_on(s):
                    self._ride_on(s, cur)
                    return
        if not st.get("open") and st.get("slow_run", 0) >= DRIFT_AFTER and self._rides_training(s, cur):
            # steps accepted, each keeping most of the way, and the edge beyond the box's reach: the first
            # time, every mutation is tried from this point (an edge that a jump reaches, such as a ReLU
            # silencing a whole row, is invisible to the linear model); then the site rides the training
            if st.get("probed"):
                self._start_drift(s, cur=cur)
            else:
                st.update(probe=True, probed=True, probe_i=0)
            return
        tried = st.get("tried", 0)         # proposals already rejected for this point (a quantum may end
        mutated = False                    # in the middle of the list)
        if not tried:                      # the list's order is fixed when it starts (a resumed list is the same)
            st["qn_demoted"] = bool(st.get("qn_missed"))
        st["open"] = True                  # until the list ends: the next quantum goes on with it
        refit = bool(st.get("refit"))
        if refit and not tried:            # a list that starts afresh makes that step anyway
            st.pop("refit")
            refit = False
        for i, (label, x_new) in enumerate(self._proposals(s, cur)):
            mutated = mutated or label == "mutation"
            if i < tried and not (refit and i == 0):
                continue
            ev = s.evaluate(x_new, event=label, seed_step=st.get("seed_step"))
            if refit and i == 0:
                st.pop("refit")       # the one step from the refitted point: the list then goes on where it was
            else:
                st["tried"] = i + 1   # only once evaluated: a quantum that ends first retries it
            if ev.seen and (ev.hard < cur.hard or self._tie(st, label, ev, cur)):
                st["open"] = False
                if label == "qn":
                    st["qn_missed"] = False
                self._accept(s, x_new, ev, label)
                return
            if label == "qn" and i == 0 and QN_DEMOTE:
                st["qn_missed"] = True    # first and rejected: the Polyak steps go first until a qn step lands
        if not mutated and self._rides_from_start(s, cur):   # the weights must move first
            st["open"] = False
            self._start_drift(s, cur=cur)
            return
        # the re-measurement's one step may end the quantum: nothing is changed before it, so the next
        # quantum comes back here and makes the same step (the search does not depend on its slicing)
        rechecked = not mutated and self._recheck(s, cur)
        st["open"] = False
        st["stall"] = st.get("stall", 0) + 1
        st["prefer"] = None
        if rechecked or not mutated:      # else the same list grows by the mutations: go on where it stopped
            return
        if self._rides_on(s):
            self._ride_on(s, cur)
            return
        if self._rides_training(s, cur):  # the whole list failed, and the edge is out of the box's reach
            self._start_drift(s, cur=cur)
            return
        st["tried"] = 0
        st["escape"] = ESCAPE_STEPS              # a local minimum: walk out of it, whatever the loss does
        if st["stall"] >= STALL_REFRESH:
            st["stall"] = 0
            refresh_samples(s, REFRESH_FRACTION, cur.per_sample)
            s.cache.pop("current", None)
            forget_curvature(st)

    def _recheck(self, s, cur: Evaluation) -> bool:
        """A program that trains has taken a training step on every batch this point's proposals
        tried: the current point's margin is stale. Measure it again (one step, the same
        randomness). When the training took back more than :data:`UNDONE` of the progress the
        search made from the site's first margin, it fights the search (a hazard on the loss
        itself: each step on a batch that raises it teaches the program to lower it, faster than
        the search can follow): the site goes on from its start state, its training steps still run
        and watched but undone (:meth:`SiteSearch.freeze`), and True. When it took back less, the point
        is measured at the factory's weights too (:meth:`_recheck_factory`). Otherwise the list goes on
        where it stopped (its mutations next), from the point as it was measured."""
        st = s.strategy_state
        if "recheck_state" in st:          # a quantum ended between today's measurement and the factory's
            self._recheck_factory(s)
            return False
        origin = st.get("origin")
        if (not s.trained or s.frozen or st.get("rechecks", 0) >= RECHECKS or origin is None
                or not cur.hard < origin or not math.isfinite(cur.hard)):
            return False
        ev = s.evaluate(s.values, event="recheck", seed_step=st.get("seed_step"))
        st["rechecks"] = st.get("rechecks", 0) + 1
        if not ev.seen:
            return False
        if not ev.hard - cur.hard > UNDONE * (origin - cur.hard):
            if RECHECK_FACTORY and ev.hard > cur.hard and math.isfinite(ev.hard):
                st["recheck_state"] = s.runner.get_state()
                s.cache["recheck_today"] = ev
                self._recheck_factory(s)
            return False
        s.freeze()
        s.cache.pop("current", None)
        forget_curvature(st)
        st["tried"] = 0
        return True

    def _recheck_factory(self, s) -> None:
        """The training took back some of the search's progress, less than :data:`UNDONE` (today's
        re-measurement is ``cache["recheck_today"]``, today's state ``strategy_state["recheck_state"]``):
        measure the point at the factory's weights too (one step, the same randomness). When that margin is
        below today's and the edge is within the box's reach from there, the site goes on frozen at the
        factory's weights, as :meth:`_recheck` does on a larger loss (:data:`RECHECK_FACTORY`); else today's
        state is put back (:func:`_today_back`). Either way the list goes on where it stopped (its mutations next).

        A quantum that ends on this step leaves both kept: the next one comes back here. GRIST TF ID_6 and
        ID_7 (a softmax's cross-entropy, the hazard on the loss itself): log-space steps bring the true
        class's output 54 nats down in ten steps, the training on each tried batch takes 6 of them back,
        and every later proposal lost until twelve sign steps walked on; at the factory's weights the point
        crosses the edge: found in 43 and 41 steps at seed 1 (87 and 85 before). Measured against today's
        margin instead, the mutations took GRIST TF ID_48a elsewhere (the restart finds it in 45 steps;
        missed in 1000); frozen where the edge is out of reach, GRIST's RBM ID_62 was missed at seed 1
        (found in 554 without freezing); a list started afresh after freezing put off the mutation that
        makes a variance exactly 0 (a planted instance-norm subject: 16 -> 49 steps). The list's steps were
        made from today's gradient, though: from the point the factory's weights measure, its first step is
        tried once before the mutations (:data:`REFIT`), for an op judged in log space (a softmax output: one
        step from a fresh gradient may cross); not for the instance norm's variance (a ``sqrt``'s input that
        steps only near: an accepted step began a new list and put its mutations off, missed in 40 steps),
        nor where the edge must be landed on exactly. GRIST TF ID_29 at seed 2: log-space steps brought a
        softmax output 36 nats down in three steps, training took 20 back, and at the factory's weights the
        point measured 12.5 nats from ``log(0)``; seven mutations and two escape steps later it crossed (49
        steps), and one log-space step from there crosses (33)."""
        st = s.strategy_state
        s.freeze()
        ev = s.evaluate(s.values, event="recheck", seed_step=st.get("seed_step"))
        if ev.seen and ev.hard < s.cache["recheck_today"].hard and not self._rides_training(s, ev):
            st.pop("recheck_state")
            s.cache.pop("recheck_today")
            s.cache["current"] = ev          # the list goes on from the factory's weights
            forget_curvature(st)
            # its steps were made from today's gradient: one from the factory's first (REFIT), where one step
            # may cross (a quantity judged in log space, such as a softmax output); not at a point landed on
            # exactly, nor at an edge a margin only nears (a variance under a sqrt: each accepted step kept the
            # list's mutations off, and one of them makes it exactly 0)
            st["refit"] = REFIT and s.spec.log_space and not self._lands_exactly(s)
        else:
            _today_back(s)               # and the list goes on as it was measured

    # -- riding the program's training ---------------------------------------------------
    @staticmethod
    def _may_drift(s, cur: Evaluation, thaw: bool = False) -> bool:
        """``thaw``: a frozen site may drift too (:meth:`_rides_training`: the edge out of the box's reach)."""
        st = s.strategy_state
        return bool(s.runner.trains and (not s.frozen or (thaw and THAW)) and not st.get("drift_done")
                    and cur.seen and math.isfinite(cur.hard) and cur.hard > 0)

    def _rides_training(self, s, cur: Evaluation) -> bool:
        """The program trains, and no input in the box reaches the edge at today's weights: the
        linear model of the margin (in the space the search steps in) cannot fall to the edge inside the
        box. Only the weights can bring it there, and the program's own training moves them: the site
        rides that training (:meth:`_drift`) instead of searching the box for what is not in it.

        A frozen site too (:data:`THAW`): its training fought the search on the searched batch, and
        from the factory's weights the edge is out of the box's reach, so the frozen search has nothing
        left to find; riding the training, which the program's other terms move as well, is its one
        chance. GRIST TF ID_31, a GAN whose discriminator trains to raise ``D(x)`` on the very images
        the search lowers it on: frozen, 1000 steps ended 87 nats from ``log(0)``; ridden, the
        discriminator's logits swing with the generator's training and ``D(x)`` underflows in 519."""
        if not self._may_drift(s, cur, thaw=True):
            return False
        # a quantity that nears its edge multiplicatively (a softmax output) is judged in log space:
        # in the op's input space a linear model reaches 0 from 1e-3 in one step, and never gets there
        if s.spec.log_space and cur.log_grads is not None and math.isfinite(cur.log_loss):
            g, need = cur.log_grads, cur.log_loss
        else:
            g, need = cur.grads, cur.hard
        return g is not None and box_reach(s.values, g, s.bounds) < need

    @staticmethod
    def _rides_on(s) -> bool:
        """A site whose rides gave up for good (its drift and the ride from the factory's state, each
        :data:`DRIFT_PATIENCE` steps without a new low), in a program that trains, rides once more from
        today's state after every :data:`RIDE_ON` lists of proposals that failed whole: the training's walk
        that took the margin away may bring it back, and lists of steps on today's weights do not move
        them the way the training does. GRIST TF ID_44 (a CNN's softmax, 20,000 steps at seed 0): the ride
        came within 8.3 nats of ``log(0)`` at step 3000, the walk carried it back to 23 by step 4000, both
        rides gave up, and the site spent its last 15,000 steps on lists between 26 and 51 nats; riding on,
        it is found at step 8735 (GRIST's loop: 4509 iterations). Only after two give-ups, 800 steps at
        the least: no search the suite finds within that is touched. Called once per list that failed
        whole, which it counts (the count is the site's state: a resumed search goes on with it)."""
        st = s.strategy_state
        if not (RIDE_ON and st.get("drift_done") and s.runner.trains):
            return False
        st["done_lists"] = st.get("done_lists", 0) + 1
        if st["done_lists"] < RIDE_ON:
            return False
        st["done_lists"], st["drift_done"] = 0, False
        return True

    def _ride_on(self, s, cur: Evaluation) -> None:
        """Ride again after the rides gave up (:meth:`_rides_on`), from today's weights; with
        :data:`RIDE_REAL`, GRIST's way: on the site's first batch (real data) with the weakest row of the
        point kept, by sign steps on the margin's gradient alone (no lookahead), rows refreshed at random,
        not by importance, the weakest among them (:func:`_drift_refresh`), and given up after
        :data:`REAL_PATIENCE` steps without a new low.

        A bug that only a long training reaches needs the program to train on its own data. GRIST TF ID_40
        (a softmax regression, plain gradient descent from zero weights, whose ``log`` underflows only at a
        corner of the box far from the data once the weights have grown for tens of thousands of steps):
        the rides of the list's point train on a batch whose every row the search moved to a corner, with
        mixed labels, and the weights stop growing; after its rides gave up, the site crawled 75,000 steps
        on log-space steps each a little better than the last (never a failed list) and ended 78 nats from
        the edge in 80,000. Riding on GRIST's way from step 4914, it is found at step 69,791 (GRIST's loop:
        34,898 iterations, two passes each). The refresh by importance replaced the rows far from the
        edge, the middle class's: the batch drifted toward the other two (48, 7, 45 of 100), and the same
        ride ended 8.7 nats short."""
        st = s.strategy_state
        self._start_drift(s, "crawl", cur)
        if not RIDE_REAL:
            return
        keep = self._weakest_rows(s, cur)
        # the batch goes back to the site's first (real) data; searched weights are another space, not rows
        # of a batch: they stay where today's search left them
        real = dict(s.values)
        for k, v in s.original.items():
            if k.startswith(WEIGHT_PREFIX):
                continue
            real[k] = np.array(v, copy=True)
            if len(keep) < s.batch_size and k in s.values and np.shape(s.values[k]) == np.shape(v):
                real[k][keep] = s.values[k][keep]
        s.values = real
        st.update(real_ride=True, arm=DRIFT_ARMS.index("grad"))

    def _rides_from_start(self, s, cur: Evaluation) -> bool:
        """The site's first list of proposals failed at its first point (its gradient steps,
        backtracking and sign step), in a program that trains, with the edge out of the box's reach
        under the linear model: the site rides the training at once. A point that only slow steps led
        to (each kept more than :data:`SLOW` of the way) counts as the first point (:data:`SLOW_START`):
        GRIST's VAE ID_36a at seed 2 accepted a first log-space step that kept 97% of the way, crawled
        on by eight quasi-Newton steps and a probe of every mutation, and rode the training at step 48
        (found at 79; 43 riding at the first failed list, as its seeds 0 and 1 do from the first point).
        The mutations that would come next (eleven steps) are for a point whose edge is within reach;
        out of it, each costs a step that the training would have used (GRIST's VAE ID_35a: 22 of its
        73 steps). Not for an edge
        the search must land on exactly (a zero divisor, a backward hazard): its mutations are its
        best chance."""
        st = s.strategy_state
        # accepted points that each kept most of the way (and no escape walk) left the site where it started
        fresh = st.get("points", 0) == 0 or (SLOW_START and st.get("points", 0) == st.get("slow_run", 0))
        # "drift_why": set by the first drift and kept after it ends (a site that drifted has had its turn)
        if not fresh or "drift_why" in st or self._lands_exactly(s):
            return False
        return self._rides_training(s, cur)

    @staticmethod
    def _start_drift(s, why: str = "box", cur: Evaluation | None = None) -> None:
        """``why``: "box" (the edge out of the box's reach: drifting ends once it is within it again),
        or "crawl" (a long run of slow steps: drifting ends only with its patience). A site's first
        drift, in a program that has trained, first measures the program's training from the
        factory's state on the point (:meth:`_restart`), once the search has taken :data:`RESTART_AFTER`
        steps: before that, its few batches have barely moved the weights, and the two evaluations cost
        more than they can win (GRIST's MNIST VAEs ride from step 10: in each trace of ID_36a, ID_39a and
        ID_43a the factory's step on the point left a margin above today's, four steps lost each time)."""
        st = s.strategy_state
        s.thaw()              # a frozen site drifts only where _rides_training thawed it
        if (RESTART and "drift_why" not in st and cur is not None and cur.seen and math.isfinite(cur.hard)
                and s.trained and not s.config.search_weights and s.step >= RESTART_AFTER):
            st["restart"] = {"margin": float(cur.hard), "passes": 0}
            st["restart_state"] = s.runner.get_state()
        st.update(drift=True, drift_why=why, drift_steps=0, drift_best=math.inf,
                  drift_since=0, escape=0, tried=0, open=False)
        s.cache.pop("current", None)

    @staticmethod
    def _restart(s) -> None:
        """Ride the training from the factory's state, or from today's: the point the search got to is
        trained on from the factory's weights for one step, and the margin that step leaves is
        measured (:data:`RESTART_PASSES` evaluations); the drift starts from there when it is below the
        point's margin under today's weights, else today's state is put back.

        The weights today are the training's on every proposal the search tried, each a batch no
        training would see (box corners, mutations): a training that starts over on the point alone
        is the program's own first step on it. GRIST TF ID_48a (an MLP whose softmax layer starts at
        zero, Adagrad at 0.3): the factory's first step on the point underflows the softmax; from the
        weights the search's 46 steps had trained into, the drift ended 20 nats short in 1000 steps."""
        st = s.strategy_state
        rs = st["restart"]
        if rs["passes"] == 0:
            # again when a quantum ended before the first evaluation ran: the runner is still at the
            # factory's state then (nothing trained it since), so a second reset changes nothing
            s.runner.reset()
        ev = s.evaluate(s.values, event="restart", seed_step=st.get("seed_step") if DRIFT_CRN else None)
        rs["passes"] += 1
        if rs["passes"] < RESTART_PASSES and ev.seen:
            return
        st.pop("restart")
        state = st.pop("restart_state")
        if not (ev.seen and ev.hard < rs["margin"]):
            s.runner.set_state(state)

    def _drift(self, s) -> None:
        """One step of GRIST's kind on the inputs, taken whatever the margin does (the program's
        training between steps is what moves it): each coordinate moves a fixed share of its box
        against the sign of the hard minimum's gradient (the log-space one's sign; a soft minimum's
        pulls on near-ties cancel where one element must be driven all the way) plus, by the rule
        of the moment, the sign of the lookahead gradient (how the inputs steer the program's next
        training step toward the edge, ``Evaluation.train_grads``): on every sample, on the weakest
        one only, or not at all (:data:`DRIFT_ARMS`, chosen by :meth:`_drift_arm` from how fast
        each made the margin fall here: the lookahead on every sample finds a LeNet's softmax
        underflow in a tenth of sign steps' steps, and slows an SGD-trained MLP with dropout). The
        margin each step measures falls as training drifts; once the edge is within the box's reach
        again the site goes back to landing on it with Polyak steps. A refresh every
        :data:`DRIFT_REFRESH` steps, as GRIST's; drifting is given up for good after
        :data:`DRIFT_PATIENCE` steps without a margin below the lowest the drift itself measured
        (training that fights; not the site's best, which may be a point measured under weights the
        training has since moved past)."""
        st = s.strategy_state
        if "restart" in st:
            self._restart(s)
            return
        ev = s.evaluate(s.values, event="drift", lookahead=True,
                        seed_step=st.get("seed_step") if DRIFT_CRN else None)
        note_reachability(s, ev)
        st["drift_steps"] = st.get("drift_steps", 0) + 1
        if s.unreachable or not ev.seen:
            return
        if ev.per_sample is not None:
            st["last_per_sample"] = ev.per_sample
            importance(s, ev.per_sample)       # the reference a refresh measures each sample's move from
        # progress is the drift's own: the margin it measures now against the lowest it measured, not the
        # site's best (a point measured under weights the training has since moved on from)
        if s.last_loss < st.get("drift_best", math.inf):
            st["drift_best"], st["drift_since"] = float(s.last_loss), 0
        else:
            st["drift_since"] = st.get("drift_since", 0) + 1
        boxed = st.get("drift_why", "box") == "box"
        real = bool(st.get("real_ride"))
        patience = REAL_PATIENCE if real else DRIFT_PATIENCE
        if (boxed and not self._rides_training(s, ev)) or st["drift_since"] >= patience:
            if st["drift_since"] >= patience:
                st.pop("real_ride", None)
                if RIDE_AGAIN and not st.get("ridden_again"):
                    self._ride_again(s)
                    return
                st["drift_done"] = True
            st.update(drift=False, tried=0, open=False, stall=0)
            if not DRIFT_CRN:
                st["seed_step"] = s.step - ev.passes     # the point's randomness: the pass just measured
            s.cache["current"] = ev
            return
        arm = "grad" if real else DRIFT_ARMS[self._drift_arm(st, s.last_loss)]
        before = s.values
        if ev.grads is not None and ev.connected:
            ahead = ev.train_grads if arm != "grad" else None
            if arm == "row" and ahead is not None:
                ahead = _rows_only(ahead, self._weakest_rows(s, ev))
            s.values = drift_step(s.values, ev.grads, ahead, DRIFT_FRACTION, s.bounds)
        if st["drift_steps"] % DRIFT_REFRESH == 0 or (STUCK_REFRESH and _stuck(ev, before, s.values)):
            _drift_refresh(s, ev.per_sample)

    @staticmethod
    def _ride_again(s) -> None:
        """The drift measured no margin below its lowest for :data:`DRIFT_PATIENCE` steps: the walk of the
        weights went astray (it is chaotic: a float rounded otherwise sends it elsewhere). Ride once more
        (:data:`RIDE_AGAIN`), as GRIST would start: from the factory's state, on the site's first batch, under
        a new draw of the program's randomness, by sign steps on the margin alone (the ``grad`` rule), the
        direction rules tried again from scratch. GRIST TF ID_1 (a spatial transformer trained from zero
        weights, Adam): one seed's drift fell from 84 nats to 40, climbed back to 70 and gave up at step 640;
        the budget left went to a crawl of Polyak steps from 70 to 74 nats. A second ride is the budget's
        better use: GRIST's sign steps found that bug in 129 steps."""
        st = s.strategy_state
        s.runner.reset()
        s.values = {k: np.array(v, copy=True) for k, v in s.original.items()}
        st["ridden_again"] = True
        st["seed_step"] = s.step
        for key in ("arm_gain", "arm_used", "phases", "phase_losses", "last_per_sample"):
            st.pop(key, None)
        st.update(arm=DRIFT_ARMS.index("grad"), drift_steps=0, drift_best=math.inf, drift_since=0)

    @staticmethod
    def _drift_arm(st: dict, loss: float) -> int:
        """Which direction rule the next drift step takes (an index into :data:`DRIFT_ARMS`): each is
        tried for :data:`DRIFT_PHASE` steps, its gain (how fast the margin fell, median of the first
        and last three) kept as a running mean; then the best so far, and now and then the one left
        untried longest."""
        losses = st.setdefault("phase_losses", [])
        losses.append(float(loss) if math.isfinite(loss) else 1e300)
        arm = int(st.get("arm", 0))
        if len(losses) < DRIFT_PHASE:
            return arm
        gain = (float(np.median(losses[:3])) - float(np.median(losses[-3:]))) / len(losses)
        gains = st.setdefault("arm_gain", [None] * len(DRIFT_ARMS))
        gains[arm] = gain if gains[arm] is None else 0.5 * gains[arm] + 0.5 * gain
        used = st.setdefault("arm_used", [-1] * len(DRIFT_ARMS))
        phase = int(st.get("phases", 0)) + 1
        st["phases"], used[arm] = phase, phase
        untried = [i for i, g in enumerate(gains) if g is None]
        if untried:
            arm = untried[0]
        elif phase % DRIFT_EXPLORE == 0:
            arm = int(np.argmin(used))
        else:
            arm = int(np.argmax(gains))
        st["arm"], st["phase_losses"] = arm, []
        return arm

    def refresh(self, s, fraction: float) -> None:
        """The scheduler saw a plateau. The first time, walk out of the local minimum (the
        samples may be right: a ReLU region, a ridge); the next time, refresh samples. A site
        that rides the program's training refreshes as GRIST does (a small share: most of the
        batch is what the training drifts on); a ride on the program's own data (:data:`RIDE_REAL`) as its
        own refresh does, rows drawn at random."""
        st = s.strategy_state
        if "recheck_state" in st:         # a quantum ended between the two measurements
            _today_back(s)
        if st.get("drift"):
            _drift_refresh(s, st.get("last_per_sample"))
            return
        if not st.get("walked"):
            st["walked"] = True
            st["escape"] = max(st.get("escape", 0), ESCAPE_STEPS)
            return
        st["walked"] = False
        refresh_samples(s, fraction, st.get("last_per_sample"))
        forget_curvature(st)

    @staticmethod
    def _tie(st: dict, label: str, ev: Evaluation, cur: Evaluation) -> bool:
        """A non-monotone acceptance of gradient steps (as in Grippo-Lampariello-Lucidi line
        searches): at the float resolution of the op's input the margin is quantised and
        noisy by an ulp while the gradient still points the way (two embeddings 1e-4 rad
        apart compute a cosine of exactly 1.0, or one ulp below; a variance from cancellation
        moves by a few ulps of the mean square). A few steps no worse than the recent accepted
        margins, and at most :data:`TIE_RATIO` times the current one, are taken; a strict
        improvement ends the run. The bound keeps a tie a tie: with the site's first margin
        (a softmax output of 0.1) among the recent ones, a step from 1e-28 back to 1e-9 was once
        taken as one (GRIST TF ID_48a), and the point was lost."""
        recent = st.get("recent") or [cur.hard]
        if (label in ("qn", "linear", "log") and ev.hard <= max(recent) and ev.hard <= TIE_RATIO * cur.hard
                and st.get("ties", 0) < MAX_TIES):
            st["ties"] = st.get("ties", 0) + 1
            return True
        return False

    def _escape(self, s, cur: Evaluation) -> None:
        """Sign steps taken unconditionally, as GRIST does: they cross ReLU kinks and ridges
        where the monotone Polyak iteration stalls."""
        st = s.strategy_state
        forget_curvature(st)                  # curvature from before the walk describes another place
        if cur.grads is None or not cur.connected:
            st["escape"] = 0
            return
        sizes = {k: ESCAPE_FRACTION * (hi - lo) for k, (lo, hi) in s.bounds.items()}
        x_new = sign_step(s.values, cur.grads, sizes, s.bounds)
        if ESCAPE_STUCK and (s.frozen or not s.runner.trains) and _in_place(s.values, x_new):
            # every input pinned at the bound its gradient points to, and no training between steps: each
            # step left would measure this very point again (GRIST TF ID_29 at seed 2, frozen: ten steps)
            st["escape"] = 0
            return
        ev = s.evaluate(x_new, event="escape", seed_step=st.get("seed_step"))
        st["escape"] -= 1                     # only once taken: a quantum that ends first takes it next
        if ev.seen:
            s.values, s.cache["current"] = x_new, ev
            st["tried"] = 0
            st["points"] = st.get("points", 0) + 1

    def _accept(self, s, values: dict, ev: Evaluation, label: str) -> None:
        st = s.strategy_state
        cur = s.cache.get("current")
        if cur is not None and label in ("linear", "crossing", "retry"):
            st["mult"] = adapt_multiplier(st.get("mult", 1.0), label, cur.hard, ev.hard)
        if cur is not None and label not in ("mutation", "early"):
            remember_curvature(st, s, s.values, cur, values, ev)
        elif label in ("mutation", "early"):
            forget_curvature(st)
        if cur is None or ev.hard < cur.hard:
            st["ties"] = 0
        st["recent"] = ([] if cur is None else list(st.get("recent", [])))[-(NONMONOTONE - 1):] + [float(ev.hard)]
        if cur is not None and label != "qn":       # slow progress: the valley is narrow, try qn first
            st["slow"] = bool(cur.hard > 0 and ev.hard / cur.hard > SLOW)
        if cur is not None:                         # accepted points in a row that kept most of the way
            st["slow_run"] = st.get("slow_run", 0) + 1 if _kept(s, cur, ev) > SLOW else 0
        s.values = values
        s.cache["current"] = ev
        st["points"] = st.get("points", 0) + (cur is not None)
        if ev.per_sample is not None:
            st["last_per_sample"] = ev.per_sample
        if label in ("log", "linear", "qn"):
            st["prefer"] = label
        st["stall"] = 0
        st["tried"] = 0
        st.pop("refit", None)

    def _probe(self, s, cur: Evaluation) -> None:
        """One mutation of the probe per call (each a step; a quantum may end between them): every
        kind, from the same point; at the end the best one is accepted if it lowered the margin."""
        st = s.strategy_state
        proposals = list(self._mutations(s, cur, EARLY_MUTATIONS + MUTATIONS))   # the same list every call
        i = int(st.get("probe_i", 0))
        if i < len(proposals):
            ev = s.evaluate(proposals[i][1], event="probe", seed_step=st.get("seed_step"))
            st["probe_i"] = i + 1
            if ev.seen and ev.hard < st.get("probe_best", cur.hard):
                st["probe_best"], st["probe_at"] = float(ev.hard), i
                s.cache["probe"] = ev
            return
        at = st.pop("probe_at", None)
        st.pop("probe_best", None)
        st.update(probe=False, probe_i=0)
        ev = s.cache.pop("probe", None)
        if at is not None and ev is not None:
            self._accept(s, proposals[at][1], ev, "mutation")

    def _proposals(self, s, cur: Evaluation) -> Iterator[tuple[str, dict]]:
        st = s.strategy_state
        # the L-BFGS recursion runs only when the list gets this far (most iterations accept earlier)
        qn_first = bool(st.get("slow") or st.get("prefer") == "qn") and not st.get("qn_demoted")
        qn = quasi_newton_step(st, s, cur) if qn_first else None
        if qn is not None:
            yield "qn", qn
        spaces = self._spaces(s, cur)
        full: dict[str, dict] = {}
        for i, space in enumerate(spaces):
            x_new = self._polyak(s, cur, space)
            if x_new is not None:
                full[space] = x_new
                yield space, x_new
            if space == "linear" and not s.spec.point and x_new is not None:
                yield "crossing", self._polyak(s, cur, space, 1 + OVERSHOOT) or x_new
            if i == 0 and self._lands_exactly(s) and st.get("points", 0) == 0:
                yield from self._mutations(s, cur, EARLY_MUTATIONS, "early")
        if not qn_first:
            qn = quasi_newton_step(st, s, cur)
            if qn is not None:
                yield "qn", qn
        if full and FIRST_CUT and self._rides_from_start(s, cur):
            # the first point, in a program that trains, with its edge out of the box's reach: the full steps
            # (box corners, on which the program trains too) were tried; shorter steps along the first one
            # and a sign step reach the edge no better, and each costs a training step the ride would use
            return
        if full:                                   # backtrack along the first step's direction
            first = full[next(iter(full))]
            for t in BACKTRACK:
                yield "retry", _between(s.values, first, t)
        if cur.grads is not None and cur.connected:
            sizes = {k: SIGN_FRACTION * (hi - lo) for k, (lo, hi) in s.bounds.items()}
            yield "sign", sign_step(s.values, cur.grads, sizes, s.bounds)
        if st.get("stall", 0) >= 1 or not full:
            yield from self._mutations(s, cur)

    def _spaces(self, s, cur: Evaluation) -> list[str]:
        spaces = ["linear"]
        if s.spec.log_space and cur.log_grads is not None and math.isfinite(cur.log_loss):
            first = s.strategy_state.get("prefer") or "log"
            spaces = ["log", "linear"] if first == "log" else ["linear", "log"]
        return spaces

    def _polyak(self, s, cur: Evaluation, space: str, overshoot: float = 1.0) -> dict | None:
        """Land on the edge (``overshoot`` 1) under a local model: log-linear, or ``c * d**k``.

        Searched weights in a program that trains are not where they were measured: the program's
        training step moved them after the forward pass, and the search steps from there. The margin
        to remove is the one the linear model predicts at the trained weights (``Evaluation.train_shift``),
        not the measured one: a searched divisor (a gain that Adam moves by 0.1 a step) was otherwise
        overshot by the training's own move at every step, and never landed (GRIST TF ID_28)."""
        if space == "log":
            grads, decrease = cur.log_grads, _after_training(cur.log_loss, cur.log_train_shift)
        else:
            grads = cur.grads
            decrease = _after_training(cur.hard, cur.train_shift) * s.strategy_state.get("mult", 1.0) * overshoot
        if grads is None or not (decrease > 0) or not math.isfinite(decrease):
            return None
        return box_step(s.values, grads, decrease, s.bounds)

    @staticmethod
    def _lands_exactly(s) -> bool:
        return bool(s.spec.point or s.spec.phase == "backward")

    def _mutations(self, s, cur: Evaluation, kinds: tuple[str, ...] = MUTATIONS,
                   label: str = "mutation") -> Iterator[tuple[str, dict]]:
        rows = self._weakest_rows(s, cur)
        inputs = [k for k in s.searched if not k.startswith(WEIGHT_PREFIX)]
        salt = -1         # a jitter's seed: its place among the kinds that mutate inputs
        seen: set[bytes] = set()
        for kind in kinds:
            if kind == "support":
                x_new = _zero_support(s, cur)
                if x_new is not None:
                    yield label, x_new
                continue
            salt += 1
            x_new = dict(s.values)
            changed = False
            for key in inputs:
                value = np.array(s.values[key], copy=True)
                lo, hi = s.bounds[key]
                mutated = _mutate(kind, value, rows, lo, hi, salt)
                if mutated is not None and not np.array_equal(mutated, value):
                    x_new[key] = mutated.astype(value.dtype)
                    changed = True
            if changed:
                # in a [0, 1] box "low", "minus_one" and "zero" are one batch, "one" and "high" another, and
                # the probe's list repeats the early kinds: a batch already proposed from this point measures
                # nothing new (in a program that trains, it costs a training step on it too)
                digest = hashlib.blake2b(digest_size=16)
                for k in inputs:
                    digest.update(np.ascontiguousarray(x_new[k]).tobytes())
                key = digest.digest()
                if DEDUPE and key in seen:
                    continue
                seen.add(key)
                yield label, x_new

    def _weakest_rows(self, s, cur: Evaluation) -> list[int]:
        if cur.per_sample is not None and len(cur.per_sample) == s.batch_size:
            return [int(np.argmin(cur.per_sample))]
        return list(range(s.batch_size))


def _after_training(margin: float, shift: float) -> float:
    """The margin predicted at the trained weights, when that prediction is still above the edge; else
    the measured one (the linear model has crossed: a full step from here is the best guess left)."""
    moved = margin + shift
    return moved if moved > 0 and math.isfinite(moved) else margin


def _kept(s, before: Evaluation, after: Evaluation) -> float:
    """The share of the way to the edge a step kept, measured as the search measures the site: in log
    space for an op judged there (a softmax output from 1e-10 to 1e-12 kept 95% of 80 nats, not 1%)."""
    if s.spec.log_space and math.isfinite(before.log_loss) and math.isfinite(after.log_loss):
        a, b = after.log_loss, before.log_loss
    else:
        a, b = after.hard, before.hard
    return a / b if b > 0 else 0.0


def box_reach(x: dict[str, np.ndarray], g: dict[str, np.ndarray], bounds: dict[str, tuple[float, float]]) -> float:
    """The most a linear model with gradient ``g`` at ``x`` can fall inside the box: every
    coordinate moved to the bound its gradient points away from."""
    total = 0.0
    for k, gk in g.items():
        if k not in bounds or k not in x:
            continue
        lo, hi = bounds[k]
        v = np.asarray(x[k], dtype=np.float64)
        gk = np.asarray(gk, dtype=np.float64)
        total += float(np.where(gk > 0, gk * (v - lo), gk * (v - hi)).sum())
    return total


def _drift_refresh(s, per_sample) -> None:
    """A riding site's refresh, its own or the scheduler's: :data:`DRIFT_REFRESH_FRACTION` of the rows, the least
    important; on a ride on the program's own data (:data:`RIDE_REAL`), rows drawn at random (by importance it
    throws out the rows far from the edge, one class's, and skews the data), the weakest among them, as GRIST's
    refresh by age replaces its corner row in time: another row then walks to a corner, maybe a better one.
    GRIST's BMI regressions ID_40 to ID_42 at seeds 0, 1, 2, nine runs: 0.96x to 1.32x GRIST's loop's passes,
    1.10x in the median; keeping the weakest row, 0.96x to 1.56x, 1.06x (a narrower spread, not a clear win)."""
    if s.strategy_state.get("real_ride"):
        refresh_samples(s, DRIFT_REFRESH_FRACTION, at_random=True)
    else:
        refresh_samples(s, DRIFT_REFRESH_FRACTION, per_sample)


def _today_back(s) -> None:
    """Undo :meth:`Adaptive._recheck_factory`'s move to the factory's weights: today's state (kept before it)
    back, the site not frozen, the pending re-measurement dropped."""
    s.thaw()
    s.runner.set_state(s.strategy_state.pop("recheck_state"))
    s.cache.pop("recheck_today", None)


def _stuck(ev: Evaluation, before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> bool:
    """A drift step the next one would repeat: the program did not train on it (a non-finite value of
    an op the search stepped past skips the training step) and the sign step left every input where it
    was (pinned at the box's corner). Under the drift's fixed randomness (:data:`DRIFT_CRN`) the next
    step is this one again, and so is every step until the periodic refresh. GRIST TF ID_2a: past
    ``log(1 - p)``, which fires on every step once a softmax output rounds to 1, the drift stood on one
    loss for up to 95 steps at a time; a campaign's scheduler, seeing the plateau, refreshed it out
    (found at step 294, against 1000 steps unfound in the same campaign without those refreshes)."""
    return not ev.trained and _in_place(before, after)


def _in_place(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> bool:
    """A step that left every input where it was (pinned at the box's corner by its clip)."""
    return all(after[k] is v or np.array_equal(after[k], v) for k, v in before.items())


def _rows_only(g: dict[str, np.ndarray], rows: list[int]) -> dict[str, np.ndarray]:
    """``g`` with every sample but ``rows`` (on dimension 0) set to 0; searched weights, which have no
    samples, as they are."""
    out = {}
    for k, v in g.items():
        if k.startswith(WEIGHT_PREFIX):
            out[k] = v
            continue
        keep = np.zeros(np.shape(v)[0], dtype=bool)
        keep[rows] = True
        out[k] = np.where(keep.reshape((-1,) + (1,) * (np.ndim(v) - 1)), v, 0.0)
    return out


def drift_step(x: dict[str, np.ndarray], g: dict[str, np.ndarray], ahead: dict[str, np.ndarray] | None,
               fraction: float, bounds: dict[str, tuple[float, float]]) -> dict[str, np.ndarray]:
    """``x - h * (sign(g) + sign(ahead))`` clipped to the box, ``h`` a ``fraction`` of each box."""
    out = dict(x)
    for k, gk in g.items():
        if k not in bounds or k not in x:
            continue
        lo, hi = bounds[k]
        d = np.sign(gk)
        if ahead is not None and k in ahead:
            d = d + np.sign(ahead[k])
        out[k] = np.clip(x[k] - fraction * (hi - lo) * d, lo, hi).astype(x[k].dtype)
    return out


def adapt_multiplier(mult: float, label: str, before: float, after: float) -> float:
    """Step-size control of the input-space step (a trust region on the Polyak multiplier).

    A full step that landed well short of the edge (a margin like ``1 - cos``, ``~ d**2``,
    only halves per step) grows the multiplier; a backtracked step shrinks it.
    """
    if label == "retry":
        return max(MULT_MIN, mult / 2)
    if before > 0 and after / before > 0.2:
        return min(MULT_MAX, mult * 1.5)
    return mult


def _qn_keys(s, grads: dict | None) -> list[str] | None:
    if grads is None:
        return None
    keys = sorted(k for k in grads if k in s.bounds and k in s.values)
    size = sum(int(np.size(grads[k])) for k in keys)
    return keys if keys and size <= QN_MAX_SIZE else None


def _flat(d: dict, keys: list[str]) -> np.ndarray:
    return np.concatenate([np.asarray(d[k], dtype=np.float64).ravel() for k in keys])


def forget_curvature(st: dict) -> None:
    st.pop("qn_s", None)
    st.pop("qn_y", None)


def remember_curvature(st: dict, s, x_old: dict, ev_old: Evaluation, x_new: dict, ev_new: Evaluation) -> None:
    """Keep the pair (step, change of gradient) of an accepted step when its curvature is positive."""
    keys = _qn_keys(s, ev_old.grads)
    if keys is None or ev_new.grads is None or any(k not in ev_new.grads for k in keys):
        return
    step = _flat(x_new, keys) - _flat(x_old, keys)
    change = _flat(ev_new.grads, keys) - _flat(ev_old.grads, keys)
    curv = float(step @ change)
    if not (curv > 1e-10 * float(np.linalg.norm(step) * np.linalg.norm(change))) or not math.isfinite(curv):
        return
    S, Y = st.get("qn_s"), st.get("qn_y")
    if not isinstance(S, np.ndarray) or S.shape[1:] != step.shape:
        S, Y = np.empty((0, step.size)), np.empty((0, step.size))
    st["qn_s"] = np.vstack([S, step[None]])[-QN_MEMORY:]
    st["qn_y"] = np.vstack([Y, change[None]])[-QN_MEMORY:]


def quasi_newton_step(st: dict, s, cur: Evaluation) -> dict | None:
    """``x - H g`` (L-BFGS two-loop recursion on the free coordinates), clipped to the box."""
    S, Y = st.get("qn_s"), st.get("qn_y")
    keys = _qn_keys(s, cur.grads)
    if not isinstance(S, np.ndarray) or len(S) == 0 or keys is None or not cur.connected:
        return None
    x, g = _flat(s.values, keys), _flat(cur.grads, keys)
    if S.shape[1] != x.size:
        forget_curvature(st)
        return None
    lo = np.concatenate([np.full(np.size(s.values[k]), s.bounds[k][0]) for k in keys])
    hi = np.concatenate([np.full(np.size(s.values[k]), s.bounds[k][1]) for k in keys])
    free = ~(((x <= lo) & (g > 0)) | ((x >= hi) & (g < 0)))   # pinned at a bound and pushed outward
    q = g * free
    alphas = []
    for sv, yv in zip(S[::-1], Y[::-1]):
        a = float(sv @ q) / float(yv @ sv)
        alphas.append(a)
        q = q - a * yv
    q = q * (float(S[-1] @ Y[-1]) / float(Y[-1] @ Y[-1]))
    for (sv, yv), a in zip(zip(S, Y), reversed(alphas)):
        q = q + sv * (a - float(yv @ q) / float(yv @ sv))
    if not (float(g @ (q * free)) > 0) or not np.all(np.isfinite(q)):   # not a descent direction
        return None
    new = np.clip(x - q * free, lo, hi)
    out, at = dict(s.values), 0
    for k in keys:
        n = int(np.size(s.values[k]))
        out[k] = new[at:at + n].reshape(np.shape(s.values[k])).astype(s.values[k].dtype)
        at += n
    return out


def _between(x: dict, y: dict, t: float) -> dict:
    """``x + t (y - x)`` for the values that differ."""
    out = dict(x)
    for k, v in y.items():
        if v is not x.get(k):
            out[k] = (x[k] + t * (v.astype(np.float64) - x[k])).astype(x[k].dtype)
    return out


def _zero_support(s, cur: Evaluation) -> dict | None:
    """The searched weights with the entries the hard minimum depends on set to 0 (within bounds), or
    None when no searched weight has a gradient (or every such entry is 0 already)."""
    if cur.grads is None:
        return None
    out, changed = dict(s.values), False
    for key, g in cur.grads.items():
        if not key.startswith(WEIGHT_PREFIX) or key not in s.values or key not in s.bounds:
            continue
        value = np.asarray(s.values[key])
        support = np.asarray(g) != 0
        if support.shape != value.shape or not support.any():
            continue
        lo, hi = s.bounds[key]
        new = np.where(support, np.clip(0.0, lo, hi), value).astype(value.dtype)
        if not np.array_equal(new, value):
            out[key], changed = new, True
    return out if changed else None


def _mutate(kind: str, value: np.ndarray, rows: list[int], lo: float, hi: float, salt: int = 0) -> np.ndarray | None:
    out = value.copy()
    if kind == "zero":
        out[rows] = np.clip(0.0, lo, hi)
    elif kind == "copy":
        if value.shape[0] < 2:
            return None
        donor = (rows[0] + 1) % value.shape[0]
        out[rows] = value[donor]
    elif kind == "flat":
        if value.ndim < 2:
            return None
        axes = tuple(range(1, value.ndim))
        out[rows] = value[rows].mean(axis=axes, keepdims=True)
    elif kind == "low":
        out[rows] = lo
    elif kind == "high":
        out[rows] = hi
    elif kind == "one":
        out[rows] = np.clip(1.0, lo, hi)
    elif kind == "minus_one":
        out[rows] = np.clip(-1.0, lo, hi)
    elif kind == "jitter":     # on a boundary that rounding decides (a cosine of parallel vectors)
        # seeded by the values themselves (crc32, not hash(): that one changes per process)
        noise = np.random.default_rng([zlib.crc32(value[rows].tobytes()), salt]).standard_normal(out[rows].shape)
        out[rows] = np.clip(value[rows] * (1 + JITTER * noise) + JITTER * noise, lo, hi)
    return out
