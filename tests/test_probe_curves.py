"""The probe-curve command on a hand-made sweep whose eval reports hold known curves."""

import csv
import json

import numpy as np

from conftest import softmax_and_linear
from tmem.sweeps import probe_curves
from tmem.sweeps.gather import jobs


def test_each_configuration_is_the_median_and_band_of_its_seeds_curves(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    softmax_and_linear(sweep)  # jobs 0-2 softmax, 3-5 linear, seeds 0, 1, 2
    for job in range(6):
        folder = sweep / str(job) / "eval" / "task.num_kv_pairs=16"
        folder.mkdir(parents=True)
        accuracy = [1.0, 0.9 - 0.1 * job] if job < 5 else [0.5]  # job 5 reports only the first point
        distance = [2, 4][:len(accuracy)]
        (folder / "report.json").write_text(json.dumps({"mqar_distance": {"distance_low": distance,
                                                                          "accuracy": accuracy}}))
    (sweep / "2" / "eval" / "task.num_kv_pairs=16" / "report.json").write_text('{"mqar_distance": {}}')
    out = tmp_path / "out"
    args = [str(sweep), "--eval", "task.num_kv_pairs=16", "--x", "mqar_distance.distance_low",
            "--y", "mqar_distance.accuracy", "--logx", "--name", "forgetting", "--out", str(out)]
    assert probe_curves.main(args) == 0
    with open(out / "forgetting.csv") as f:
        table = [(r["configuration"], r["x"], r["n"], float(r["median"]), float(r["min"]), float(r["max"]))
                 for r in csv.DictReader(f)]
    expected = [("mixer=softmax", "2", "2", 1.0, 1.0, 1.0), ("mixer=softmax", "4", "2", 0.85, 0.8, 0.9),
                ("mixer=linear", "2", "3", 1.0, 0.5, 1.0), ("mixer=linear", "4", "2", 0.55, 0.5, 0.6)]
    assert [t[:3] for t in table] == [e[:3] for e in expected]
    np.testing.assert_allclose([t[3:] for t in table], [e[3:] for e in expected])
    assert (out / "forgetting.png").stat().st_size > 0 and (out / "forgetting.svg").stat().st_size > 0
    assert f"skipped: {sweep / '2' / 'eval' / 'task.num_kv_pairs=16' / 'report.json'}: KeyError" in \
        capsys.readouterr().err
    assert probe_curves.main(args) == 2  # kept unless --force
    drawn = probe_curves.probe_curves(jobs([sweep]), "eval/task.num_kv_pairs=16/report.json",
                                      "mqar_distance.distance_low", ["mqar_distance.accuracy"], logx=True, logy=True)
    assert drawn.figure.axes[0].get_xscale() == "log" == drawn.figure.axes[0].get_yscale()
