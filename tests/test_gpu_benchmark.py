"""benchmarks/gpu.sh runs end to end on a CPU at a tiny size, so the GPU run it prepares has no surprise left."""

import json
import subprocess

import pytest

from conftest import ROOT


@pytest.mark.slow  # one row of each kind, timed only: each compile costs seconds on the suite's 2 cores
def test_gpu_script_runs_at_a_tiny_size(tmp_path):
    done = subprocess.run(["bash", "benchmarks/gpu.sh", str(tmp_path), "--tiny", "--skip-train", "--rows",
                           "softmax_fused", "gated_deltanet_4096"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["matmul_tflops"] > 0 and list(results["rows"]) == ["softmax_fused", "gated_deltanet_4096"]
    for row in results["rows"].values():
        assert row["step_ms"] > 0 and 0 < row["mfu"] < 1 and row["flops"] > 0
    # timed only: the run to 0.99 is mqar_speed's time_to_target, which tests/test_benchmarks.py runs
    assert not any("target_step" in row for row in results["rows"].values())
    table = (tmp_path / "table.md").read_text()
    assert "| softmax_fused |" in table
    assert "devices: [CpuDevice(id=0)]" in (tmp_path / "log.txt").read_text()
