"""GRIST subject ID_15, Tensorflow_Value_Iteration_Networks_V1: a Value Iteration Network on 8 x 8 gridworlds.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_15/train.py with model.py's ``VI_Block``
(entry train_grist.py), the TensorFlow port of Tamar et al.'s VIN. Facts carried over: input maps
``[batch, 8, 8, 2]`` (obstacles, goal reward); a 3x3 convolution to 150 maps plus a bias, a 1x1
convolution to one reward map, a 3x3 convolution to 10 Q maps and ``k = 10`` value iterations (max
over the Q maps, concatenated with the reward map, 3x3 convolution with the tied weights ``[w,
w_fb]``), every convolution SAME with its kernel flipped in both spatial axes; the Q values at 10
query states per map, a 10 -> 8 matrix and a softmax over the 8 moves; every weight drawn from
``N(0, 1) * 0.01`` by NumPy; loss ``-mean(log(p[label]))``; centred RMSProp at 0.001 with epsilon
1e-6; batches of 12 maps; float32.

The original feeds the labels as one flat vector of ``batch * 10``; here they are fed as ``[batch,
10]`` (the batch on dimension 0, as the engine requires) and flattened in the graph.

Data: the original reads gridworld_8.mat, which cannot be fetched at run time; here random
gridworlds of the same form are synthesised: walls on the border and on about 20% of the inner cells (11% in the real file)
(value 1, free cells 0, as the original's ``(im - 1) / 255`` on uint8 yields), one goal cell of
reward 10 in the second channel, query states on free inner cells (row and column in 1..6, int32),
and as label the first of the 8 king moves that lowers the breadth-first distance to the goal.
Bounds: ``[0, 10]``, the range of the input maps. GRIST searched the maps ``X``.

Bug ID_15: ``log`` of a softmax probability that underflows to 0.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import Pool, start_session, v1
from fuzz_core import GraphTarget

SIZE, STATES, MOVES = 8, 10, [(-1, 0), (1, 0), (0, 1), (0, -1), (-1, 1), (-1, -1), (1, 1), (1, -1)]


def _distances(walls: np.ndarray, goal: tuple[int, int]) -> np.ndarray:
    dist = np.full(walls.shape, np.inf)
    dist[goal] = 0
    todo = deque([goal])
    while todo:
        r, c = todo.popleft()
        for dr, dc in MOVES:
            nr, nc = r + dr, c + dc
            if not walls[nr, nc] and dist[nr, nc] == np.inf:
                dist[nr, nc] = dist[r, c] + 1
                todo.append((nr, nc))
    return dist


def gridworlds(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, 0x61D])
    maps = np.zeros((n, SIZE, SIZE, 2), np.float32)
    s1 = np.zeros((n, STATES), np.int32)
    s2 = np.zeros((n, STATES), np.int32)
    labels = np.zeros((n, STATES), np.int32)
    for i in range(n):
        while True:
            walls = np.ones((SIZE, SIZE), bool)
            walls[1:-1, 1:-1] = rng.random((SIZE - 2, SIZE - 2)) < 0.2
            free = np.argwhere(~walls)
            goal = tuple(free[rng.integers(len(free))])
            dist = _distances(walls, goal)
            reach = [tuple(p) for p in free if 0 < dist[tuple(p)] < np.inf]
            if reach:
                break
        maps[i, ..., 0] = walls
        maps[i, goal[0], goal[1], 1] = 10.0
        for j, k in enumerate(rng.integers(0, len(reach), STATES)):
            r, c = reach[k]
            s1[i, j], s2[i, j] = r, c
            labels[i, j] = next(m for m, (dr, dc) in enumerate(MOVES) if dist[r + dr, c + dc] == dist[r, c] - 1)
    return {"X": maps, "S1": s1, "S2": s2, "y": labels}


def _conv_flipped(h, kernel):
    return tf.nn.conv2d(h, kernel[::-1, ::-1], strides=[1, 1, 1, 1], padding="SAME")


def make_target(seed: int = 0, batch: int = 12, lr: float = 0.001, k: int = 10, ch_h: int = 150,
                ch_q: int = 10) -> GraphTarget:
    pool = Pool(**gridworlds(1024, seed))
    init = np.random.default_rng(seed)

    def weight(*shape):
        return tf.Variable(init.standard_normal(shape) * 0.01, dtype=tf.float32)

    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        maps = v1.placeholder(tf.float32, [None, SIZE, SIZE, 2], name="X")
        s1 = v1.placeholder(tf.int32, [None, STATES], name="S1")
        s2 = v1.placeholder(tf.int32, [None, STATES], name="S2")
        labels = v1.placeholder(tf.int32, [None, STATES], name="y")
        bias, w0, w1 = weight(1, 1, 1, ch_h), weight(3, 3, 2, ch_h), weight(1, 1, ch_h, 1)
        w, w_fb, w_o = weight(3, 3, 1, ch_q), weight(3, 3, 1, ch_q), weight(ch_q, 8)
        reward = _conv_flipped(_conv_flipped(maps, w0) + bias, w1)
        q = _conv_flipped(reward, w)
        tied = tf.concat([w, w_fb], 2)
        for _ in range(k - 1):
            value = tf.reduce_max(q, axis=3, keepdims=True)
            q = _conv_flipped(tf.concat([reward, value], 3), tied)
        q = _conv_flipped(tf.concat([reward, tf.reduce_max(q, axis=3, keepdims=True)], 3), tied)
        rows = tf.repeat(tf.range(tf.shape(q)[0]), STATES)
        where = tf.stack([rows, tf.reshape(s1, [-1]), tf.reshape(s2, [-1])], axis=1)
        policy = tf.nn.softmax(tf.matmul(tf.gather_nd(q, where), w_o))
        flat = tf.reshape(labels, [-1])
        picked = tf.stack([tf.range(tf.shape(flat)[0]), flat], axis=1)
        cost = -tf.reduce_mean(tf.gather_nd(tf.math.log(policy), [picked]))  # GRIST bug ID_15
        train = v1.train.RMSPropOptimizer(lr, epsilon=1e-6, centered=True).minimize(cost)
    return GraphTarget(graph=graph, session=start_session(graph),
                       feeds={"X": maps, "S1": s1, "S2": s2, "y": labels}, loss=cost, train_op=train,
                       sample=lambda r: pool.draw(r, batch), bounds={"X": (0.0, 10.0)}, search=["X"])
