"""Finding folders are unique per finding (issue 55, item 3): variants of one program built under one
target name (GRIST's SC_DNN ID_28a-d, as the benchmark builds them) wrote into each other's folders, and
the run record pointed at the wrong files."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fuzz_core.findings import Finding, finding_folder, load_finding, write_finding
from fuzz_core.sites import make_site


def _finding(args: dict, step: int = 3, value: float = 1.0) -> Finding:
    """A finding of target ``sc_dnn`` (one name) built with ``args``: the same site id for every variant."""
    site = make_site("sc_dnn", "div", "RealDiv", "division by zero", "progs/sc_dnn.py:56", 0, column=9)
    return Finding(site=site, target={"name": "sc_dnn", "entry": "progs/sc_dnn.py:make_target", "args": args,
                                      "framework": "tensorflow", "seed": 0},
                   inputs={"x": np.full((1, 2), value, np.float32)}, state=None, step=step, step_seed=1,
                   strategy="adaptive", first_op=None, trigger="inputs", training=False, bounds={"x": (0.0, 1.0)})


def _write(findings_dir: Path, finding: Finding) -> Path:
    folder, there = finding_folder(findings_dir, finding)
    if not there:
        write_finding(finding, folder)
    return folder


def test_two_targets_with_the_same_name_keep_both_findings(tmp_path: Path):
    a = _finding({"variant": "a"}, value=1.0)
    c = _finding({"variant": "c"}, value=2.0)
    assert a.folder_name == c.folder_name, "the case: one name, one site id, one step"
    fa, fc = _write(tmp_path, a), _write(tmp_path, c)
    assert fa != fc and fc.name == f"{a.folder_name}-2"
    assert load_finding(fa).report["target"]["args"] == {"variant": "a"}
    assert load_finding(fc).report["target"]["args"] == {"variant": "c"}
    np.testing.assert_array_equal(load_finding(fa).inputs["x"], a.inputs["x"])   # nothing overwritten
    np.testing.assert_array_equal(load_finding(fc).inputs["x"], c.inputs["x"])
    # the same finding again (a driver killed after writing it, resumed): its own folder, not a third
    assert finding_folder(tmp_path, _finding({"variant": "c"}, value=2.0)) == (fc, True)
    assert finding_folder(tmp_path, _finding({"variant": "a"})) == (fa, True)
    # another step of the same site's search: a folder of its own
    later = _write(tmp_path, _finding({"variant": "a"}, step=9))
    assert later not in (fa, fc) and json.loads((later / "finding.json").read_text())["step"] == 9
    assert len(list(tmp_path.iterdir())) == 3
