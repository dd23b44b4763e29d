"""The speed benchmark runs end to end at a tiny size, so its documented command does not rot between measurements."""

import json

import pytest

from conftest import run_entry


@pytest.mark.slow
def test_fast_weight_speed_times_every_row_and_form(tmp_path):
    out = tmp_path / "speed.json"
    # two rows (a per-channel decay, a delta rule with a decay) at one length: every row at every length was
    # 26 compiles, the suite's costliest smoke test; the rows' math is tested elsewhere
    rows = ["gla", "gated_deltanet"]
    done = run_entry("benchmarks/fast_weight_speed.py", "--rows", *rows, "--lengths", "48", "--repeats", "1",
                     "--batch", "1", "--heads", "1", "--d", "8", "--chunk", "16", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    timed = {(r["form"], r["row"], r["T"]) for r in results if r["ms"] is not None}
    expected = {(form, row, 48) for row in rows for form in ("chunked", "recurrent")}
    assert expected | {("softmax", None, 48)} == timed
    assert "| gla | chunked |" in done.stdout


@pytest.mark.slow
def test_mqar_rows_times_each_row_against_the_first_and_trains_each(tmp_path):
    # the overrides after the rows, where `--rows` would take them for rows
    # a target any run reaches at its first evaluation, so the last table is printed
    done = run_entry("benchmarks/mqar_rows.py", "--seeds", "0", "--steps", "2", "--rounds", "1",
                     "--rows", "softmax", "linear", "train.steps=2", "train.eval_every=1", "train.batch_size=4",
                     "train.microbatch=null", "task.heldout_size=8", "model.width=16", "train.target=0.0",
                     "train.early_stop=false")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results["rows"]) == set(results["runs"]) == {"softmax", "linear"}
    assert all(r["steps"] == 2 and r["target_step"] == 1 for runs in results["runs"].values() for r in runs)
    assert "linear" in done.stdout and "x softmax" in done.stdout
    # the seed's time over softmax's on the same seed, as the lowest and highest of the seeds' ratios
    (run,), (softmax,) = results["runs"]["linear"], results["runs"]["softmax"]
    ratio = run["target_seconds"] / softmax["target_seconds"]
    line = next(line for line in done.stdout.splitlines() if line.startswith("linear ") and "[1]" in line)
    assert line.split()[-1] == f"{ratio:.2f}-{ratio:.2f}", line


@pytest.mark.slow
def test_mqar_speed_prints_the_analytic_count_beside_xlas():
    done = run_entry("benchmarks/mqar_speed.py", "--skip-train", "train.batch_size=8", "train.microbatch=4",
                     "model.width=16")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    # two microbatches under lax.map: XLA's cost analysis counts one, on one device, the analytic count both, whole
    assert 1.6 < results["flops"] / (results["xla_flops"] * results["devices"]) < 2.2
    assert "XLA's cost analysis" in done.stdout


@pytest.mark.slow  # one row: each (row, size) is a training step's compile (20 s for two rows)
def test_microbatch_times_each_row_at_each_slice_and_names_the_fastest():
    done = run_entry("benchmarks/microbatch.py", "--rows", "linear", "--sizes", "2", "4", "--steps", "2",
                     "--rounds", "1", "train.batch_size=4", "task.heldout_size=8", "model.width=16")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results) == {"linear"}
    for row in results.values():
        assert set(row["step_ms"]) == {"2", "4"} and str(row["fastest"]) in row["step_ms"]
        assert row["step_ms"][str(row["fastest"])] == min(row["step_ms"].values())


@pytest.mark.slow  # one row: each (row, chunk) is an evaluation's compile
def test_eval_chunk_times_each_row_at_each_chunk_and_names_the_fastest():
    done = run_entry("benchmarks/eval_chunk.py", "--rows", "gla", "--chunks", "2", "4", "--rounds", "1",
                     "task.heldout_size=12", "model.width=16")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results) == {"gla"}
    for row in results.values():
        assert set(row["eval_ms"]) == set(row["compile_s"]) == {"2", "4"}
        assert row["eval_ms"][str(row["fastest"])] == min(row["eval_ms"].values())


@pytest.mark.slow  # two rows' training steps compiled (mesa in its chunked form)
def test_long_sequences_gives_each_rows_memory_and_time_and_mesas_ratio(tmp_path):
    out = tmp_path / "long.json"
    done = run_entry("benchmarks/long_sequences.py", "--rows", "mesa", "gated_deltanet", "--lengths", "16",
                     "--steps", "1", "--json", str(out), "mixer.run.form=chunked", "mixer.run.chunk=4",
                     "model.width=16", "mixer.heads=2")
    assert done.returncode == 0, done.stderr[-3000:]
    cells = json.loads(out.read_text())
    assert [(c["row"], c["T"]) for c in cells] == [("mesa", 16), ("gated_deltanet", 16)]
    for c in cells:
        assert c["peak_mb"] >= c["temp_mb"] > 0 and c["arguments_mb"] > 0 and c["step_ms"] > 0
    assert "T 16: mesa's peak" in done.stdout and "| mesa | 16 |" in done.stdout


@pytest.mark.slow
def test_profile_step_sums_the_trace_by_operation():
    done = run_entry("benchmarks/profile_step.py", "--steps", "2", "--top", "3", "train.batch_size=4",
                     "train.microbatch=null", "model.width=16", "task.heldout_size=8")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    shares = [float(line.split("%")[0].split()[-1]) for line in lines if "% " in line and " ops " in line]
    assert shares and 99.0 < sum(shares) <= 101.0  # every kind, or the costliest 20 and the rest in one line
    assert any("dot" in line or "fusion" in line for line in lines[-3:])  # the costliest operations, by HLO name
