"""The speed benchmark runs end to end at a tiny size, so its documented command does not rot between measurements."""

import json

import pytest

from conftest import run_entry


@pytest.mark.slow
def test_fast_weight_speed_times_every_row_and_form(tmp_path):
    out = tmp_path / "speed.json"
    done = run_entry("benchmarks/fast_weight_speed.py", "--lengths", "32", "48", "--repeats", "1", "--batch", "1",
                     "--heads", "1", "--d", "8", "--chunk", "16", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    rows = ["linear", "retnet", "gla", "mamba2", "deltanet", "gated_deltanet"]
    timed = {(r["form"], r["row"], r["T"]) for r in results if r["ms"] is not None}
    expected = {(form, row, T) for row in rows for form in ("chunked", "recurrent") for T in (32, 48)}
    assert expected | {("softmax", None, 32), ("softmax", None, 48)} == timed
    assert "| retnet | chunked |" in done.stdout
