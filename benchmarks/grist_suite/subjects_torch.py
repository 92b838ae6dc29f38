"""The PyTorch half of GRIST's benchmark: 22 subjects, 22 bugs, each re-expressed as a target factory.

Which subjects are PyTorch: those whose program (the entry file of GRIST's
``scripts/utils/run_all.py`` without ``_grist``) imports ``torch``. Each factory's docstring
names its original, what it computes, the bug, the data it runs on here and its bounds.

GRIST's published per-bug figures (iterations and seconds to trigger) could not be found
in any source reachable from here (the paper's tables are not in its repository), so every
``Published`` record is left empty; see the suite's README.
"""
from __future__ import annotations

from benchmarks.grist_suite.model import Bug, Subject

PROGRAMS = "benchmarks/grist_suite/torch_programs"

TABLE = "the program's own data table (no download)"
FREE_LOGITS = "a free logit tensor drawn by torch.rand as the original does (no download)"
MNIST = "MNIST replaced by scikit-learn's digits in MNIST's layout (28x28 in [0, 1])"
FASHION = "FashionMNIST replaced by scikit-learn's digits in its layout (28x28 in [0, 1])"


def _entry(module: str) -> str:
    return f"{PROGRAMS}/{module}.py:make_target"


def _one(sid: int, name: str, module: str, op: str, data: str, note: str = "", **args) -> Subject:
    return Subject(id=sid, name=name, framework="torch", data=data,
                   bugs=(Bug(id=f"ID_{sid}", op=op, entry=_entry(module), args=dict(args), note=note),))


SUBJECTS: list[Subject] = [
    _one(4, "Pytorch_Geometric_Fork", "id04_vgae_kl", "exp",
         "the test's node features (all 2.0), no download",
         note="exp(logvar) with the fork's clamp removed; the fork's log(logvar) in the KL is a second suspect op"),
    _one(5, "MatchZoo", "id05_matchzoo_rank_ce", "log",
         "scores drawn by torch.rand and fixed relevance labels, as the test does",
         note="the library's log(softmax); GRIST's harness called a sqrt variant that cannot go non-finite"),
    _one(12, "Skorch", "id12_skorch_mnist", "log", MNIST,
         note="skorch's torch.log(y_proba) before NLLLoss"),
    _one(13, "Pytorch_Geometric", "id13_pyg_softmax", "log",
         "edge attributes drawn from randint(0, 3) as the test does",
         note="src.log() in this version's softmax; the division by the group's sum of logs is a second suspect op"),
    _one(22, "git1_rbm", "id22_git1_rbm", "exp", MNIST,
         note="run as GRIST ran it: its entry dropped the program's .bernoulli() draw (binarize=False)",
         binarize=False),
    _one(23, "pytorch_tu", "id23_softmax_cost", "log", FREE_LOGITS),
    _one(26, "PyTorchDeepLearningStart.0401_logistic_regression", "id26_logistic_regression", "log", TABLE),
    _one(27, "PyTorchDeepLearningStart.0503_softmax_regression_cost", "id27_softmax_regression_cost", "log",
         FREE_LOGITS),
    _one(32, "PyTorchDeepLearningStart.0504_softmax_regression", "id32_softmax_regression", "log", TABLE),
    _one(33, "TodayILearned.logistic_classification", "id33_logistic_classification", "log", TABLE),
    _one(34, "TodayILearned.softmax_classification", "id34_softmax_classification", "log", TABLE),
    _one(37, "MachineLearning.lab05", "id37_lab05_logistic_regression", "log", TABLE),
    _one(38, "MachineLearning.lab09", "id38_lab09_xor", "log", TABLE),
    _one(46, "Study.torch20_softmax", "id46_torch20_softmax", "log", FREE_LOGITS),
    _one(47, "Study.torch21_Softmax_Reg1", "id47_softmax_reg1", "log", TABLE),
    _one(51, "RBM", "id51_rbm", "exp", MNIST,
         note="run as GRIST ran it: its entry dropped the program's .bernoulli() draw (binarize=False)",
         binarize=False),
    _one(53, "DataScience.h02", "id53_h02_logistic_manual_gd", "log", TABLE,
         note="trained by hand-written gradient descent (train_step), no optimizer object"),
    _one(54, "DataScience.h03", "id54_h03_softmax_adam", "log", TABLE),
    _one(56, "start_beginner_kaggle.01", "id56_logistic_regression", "log", TABLE),
    _one(57, "start_beginner_kaggle.03", "id57_softmax_cost", "log", FREE_LOGITS),
    _one(62, "gongdols.denoising_RBM", "id62_denoising_rbm", "exp", FASHION),
    _one(63, "gongdols.main", "id63_gongdols_rbm", "exp", MNIST),
]
