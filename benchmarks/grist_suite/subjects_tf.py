"""The TensorFlow subjects of the GRIST benchmark (41 programs, 57 bugs), as CDeepFuzz targets.

One :class:`~benchmarks.grist_suite.model.Subject` per TensorFlow program of GRIST's
``dataset_info.md`` (a subject is TensorFlow when its original program imports ``tensorflow``).
Each factory lives in ``benchmarks/grist_suite/tf_programs/`` and marks the line of every bug's
op with ``# GRIST bug <id>``; ids follow GRIST's paper, a letter per bug in the order of
``scripts/utils/run_all.py``'s entry files. Where GRIST's entry files are variants of the program
(one bug left open in each), the factory takes ``variant`` and the bug names it in ``args``.

Every subject runs here: none needs a download (data are synthesised or come from
scikit-learn's digits, see each module's docstring), none needs a GPU. GRIST's paper gives
per-bug figures that are not reproduced here (``Published`` stays empty): its totals are 78 of
79 bugs found, one known bug missed.
"""
from __future__ import annotations

from benchmarks.grist_suite.model import Bug, Published, Subject

_DIR = "benchmarks/grist_suite/tf_programs"
MNIST = "MNIST stand-in: scikit-learn's 8x8 digits enlarged to 28x28, pixels in [0, 1] (synthesised)"
MNIST_SIGNED = "MNIST stand-in (scikit-learn's digits) mapped to [-1, 1] as the program maps MNIST (synthesised)"


def _entry(module: str) -> str:
    return f"{_DIR}/{module}.py:make_target"


def _one(sid: int, name: str, module: str, op: str = "log", data: str = MNIST, note: str = "",
         max_steps: int | None = None) -> Subject:
    """A subject with a single bug (most of them: ``log`` of a softmax that underflows)."""
    return Subject(sid, name, "tensorflow", bugs=(Bug(f"ID_{sid}", op, _entry(module), note=note),), data=data,
                   max_steps=max_steps)


def _variants(sid: int, name: str, module: str, bugs: list[tuple[str, str, str | dict]], data: str = MNIST,
              note: str = "", search_weights: bool = False, grist: dict[str, dict] | None = None) -> Subject:
    """A subject whose bugs each need one variant of the program: ``(letter, op, variant)``, the variant a
    name or the factory's whole arguments (GRIST's entry file configured the program its own way).
    ``grist``: letter -> the factory's extra arguments in GRIST's setting (``Bug.grist_setting``: without
    ``search_weights``), for a subject searched with ``search_weights``."""
    entry = _entry(module)

    def args_of(variant):
        return dict(variant) if isinstance(variant, dict) else {"variant": variant} if variant else {}

    return Subject(sid, name, "tensorflow", data=data, bugs=tuple(
        Bug(f"ID_{sid}{letter}", op, entry, note=note, search_weights=search_weights, args=args_of(variant),
            grist_setting=None if grist is None else
            {"args": {**args_of(variant), **grist.get(letter, {})}, "search_weights": False})
        for letter, op, variant in bugs))


_VAE_NOTE = ("b: the sqrt's forward value stays finite (exp underflows to 0 on a CPU that flushes denormals); "
             "NaN arises in the backward pass and the Adam update. b is searched as GRIST's entry "
             "(*_sqrt_grist.py) ran it: n_z = 2 (ID_35's original has 20) and the program's own training "
             "first, 50 epochs of MNIST's 55,000 images in batches of 100 (27,500 Adam steps)")
# the VAE chapters' sqrt entries: ``w, n_input, n_z = {}, image_size, 2`` and ``train(sess, training_epochs=50, ...)``,
# whose loop trains int(55000 / 100) batches an epoch before GRIST's search begins
VAE_SQRT = {"variant": "sqrt", "n_z": 2, "pretrain_steps": 50 * (55000 // 100)}

SUBJECTS: list[Subject] = [
    _one(1, "GitHub-IPS-1", "id01_github_ips1",
         data="cluttered-MNIST stand-in: a digits-based 28x28 digit and 5 clutter patches in 40x40, [0, 1] "
              "(synthesised)",
         note="every weight matrix starts at zero: no gradient reaches x before the program's own training"),
    _variants(2, "GitHub-IPS-6", "id02_github_ips6", [("a", "log", ""), ("b", "log", "")],
              note="one program: a is log(p), b is log(1 - p)"),
    _one(3, "GitHub-IPS-9", "id03_github_ips9"),
    _one(6, "StackOverFlow-1", "id06_stackoverflow1", note="dropout (keep 0.5) in the training pass, none in the watched one, as GRIST's entry"),
    _one(7, "StackOverFlow-2", "id07_stackoverflow2", note="dropout (keep 0.5) in the training pass, none in the watched one, as GRIST's entry"),
    _one(8, "StackOverFlow-6", "id08_stackoverflow6", note="dropout (keep 0.5) in the training pass, none in the watched one, as GRIST's entry"),
    _variants(9, "StackOverFlow-7", "id09_stackoverflow7", [("a", "log", ""), ("b", "log", "")],
              note="one program: a is log(1 - q), b is log(q)"),
    _one(10, "StackOverFlow-14", "id10_stackoverflow14"),
    _variants(11, "TensorFuzz", "id11_tensorfuzz", [("a", "exp", "exp"), ("b", "log", "log"), ("c", "div", "truediv")]),
    _one(14, "MNIST", "id14_mnist_lenet5", data=MNIST + ", zero-padded to 32x32"),
    _one(15, "Tensorflow_Value_Iteration_Networks_V1", "id15_value_iteration_networks",
         data="random 8x8 gridworlds (walls 1, goal reward 10, BFS-optimal move labels) in the form of "
              "gridworld_8.mat (synthesised)"),
    _variants(16, "FuzzForTensorflow", "id16_fuzz_for_tensorflow",
              [("a", "exp", "exp"), ("b", "log", "log"), ("c", "div", "truediv")], data=MNIST_SIGNED),
    _one(17, "TF_Unet", "id17_tf_unet", op="exp",
         data="tf_unet's toy generator re-expressed: 572x572 noisy discs, [0, 1] (synthesised at every batch)",
         note="one 572x572 image per step: about 1.5 s per forward pass on one CPU core", max_steps=100),
    _one(18, "Hands-On TensorFlow", "id18_hands_on_tensorflow"),
    _one(19, "Python-Tensorflow", "id19_python_tensorflow"),
    _one(20, "Tensorflow-Examples", "id20_tensorflow_examples"),
    _one(21, "Tensorflow-Examples-Tutorials-MNIST", "id21_tensorflow_examples_mnist"),
    _one(24, "Tensorflow_Gesture_Demo", "id24_tensorflow_gesture_demo"),
    _one(25, "Tensorflow_MNIST", "id25_tensorflow_mnist"),
    _variants(28, "SC_DNN", "id28_sc_dnn",
              [("a", "div", "creg"), ("b", "div", "creg_div2"), ("c", "div", "l2reg"), ("d", "div", "l2reg_div2")],
              note="GRIST searched a variable (a gain, or the column sums of w1), not the images",
              search_weights=True, grist={"a": {"gain_input": True}, "c": {"gain_input": True}}),
    _one(29, "MachineLearning", "id29_machine_learning", note="dropout (keep 0.5) in the training pass, none in the watched one, as GRIST's entry"),
    _one(30, "Tensorflow_In_MachineLearning", "id30_tensorflow_in_machine_learning"),
    _one(31, "GAN_MNIST", "id31_gan_mnist", data=MNIST_SIGNED,
         note="two Adam optimizers grouped in one train op; dropout (keep 0.3) inside the graph"),
    _variants(35, "deep_learning_Nikolenko_and_Co.ch10_04_01", "id35_nikolenko_ch10_04_01",
              [("a", "log", "log"), ("b", "sqrt", VAE_SQRT)], note=_VAE_NOTE),
    _variants(36, "deep_learning_Nikolenko_and_Co.ch10_04_03_Pic_10_05", "id36_nikolenko_ch10_04_03",
              [("a", "log", "log"), ("b", "sqrt", VAE_SQRT)], note=_VAE_NOTE),
    _variants(39, "deep_learning_Nikolenko_and_Co.ch10_04_04_Pic_10_06", "id39_nikolenko_ch10_04_04",
              [("a", "log", "log"), ("b", "sqrt", VAE_SQRT)], note=_VAE_NOTE),
    _one(40, "ml_plactice.bmi", "id40_ml_plactice_bmi",
         data="bmi.csv stand-in: heights 120..200 cm, weights 35..80 kg, BMI classes (synthesised)"),
    _one(41, "ml_plactice.tb_bmi", "id41_ml_plactice_tb_bmi",
         data="bmi.csv stand-in: heights 120..200 cm, weights 35..80 kg, BMI classes (synthesised)"),
    _one(42, "ml_plactice.tb_bmi2", "id42_ml_plactice_tb_bmi2",
         data="bmi.csv stand-in: heights 120..200 cm, weights 35..80 kg, BMI classes (synthesised)"),
    _variants(43, "deep_learning_Nikolenko_and_Co.ch10_04_05_Pic_10_07", "id43_nikolenko_ch10_04_05",
              [("a", "log", "log"), ("b", "sqrt", VAE_SQRT)], note=_VAE_NOTE),
    Subject(44, "CNNRelationExtraction", "tensorflow", data=MNIST, bugs=(
        Bug("ID_44", "log", _entry("id44_cnn_relation_extraction"), note="dropout (keep 0.5) inside the graph",
            # GRIST's repository records its run of CNN_grist.py in a comment atop
            # scripts/study_case/ID_44/examples/cnn-mnist/mnist_example_grist.py
            grist=Published(iterations=4522, seconds=154.15, found=True)),)),
    _variants(45, "DataStructure", "id45_data_structure", [("a", "log", "softmax"), ("b", "log", "cnn")]),
    _variants(48, "Dive_python", "id48_dive_python", [("a", "log", "deep"), ("b", "log", "easy")],
              note="a: input noise and dropout (keep 0.75) drawn inside the graph"),
    _variants(49, "deep_learning_Nikolenko_and_Co.ch10_04_06_Pic_10_08", "id49_nikolenko_ch10_04_06",
              [("a", "log", "log"), ("b", "sqrt", VAE_SQRT)], note=_VAE_NOTE),
    _one(50, "ImportantProjects", "id50_important_projects"),
    _one(52, "karch", "id52_karch"),
    _one(55, "practice", "id55_practice", note="dropout (keep 0.5) inside the graph"),
    _one(58, "pytest", "id58_pytest", note="dropout (keep 0.5) inside the graph"),
    _one(59, "tensorflow_book", "id59_tensorflow_book", note="trains by hand-written assign ops"),
    _one(60, "tensorflow_test", "id60_tensorflow_test"),
    _one(61, "tensorflow_project", "id61_tensorflow_project"),
]

BUGS: list[Bug] = [bug for subject in SUBJECTS for bug in subject.bugs]
