"""benchmarks/gpu.sh runs end to end on a CPU at a tiny size, so the GPU run it prepares has no surprise left."""

import json
import subprocess

import pytest

from conftest import ROOT


@pytest.mark.slow  # one row of each kind: each costs compiles on the suite's 2 cores
def test_gpu_script_runs_at_a_tiny_size(tmp_path):
    done = subprocess.run(["bash", "benchmarks/gpu.sh", str(tmp_path), "--tiny", "--rows", "softmax_fused",
                           "gated_deltanet_4096"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["matmul_tflops"] > 0 and list(results["rows"]) == ["softmax_fused", "gated_deltanet_4096"]
    for row in results["rows"].values():
        assert row["step_ms"] > 0 and 0 < row["mfu"] < 1 and row["flops"] > 0
    # the default job's rows run to the target (the tiny job's is 0: the first eval); the long-sequence ones are timed
    assert results["rows"]["softmax_fused"]["target_step"] == 3
    assert "target_step" not in results["rows"]["gated_deltanet_4096"]
    table = (tmp_path / "table.md").read_text()
    assert "| softmax_fused |" in table
    assert "devices: [CpuDevice(id=0)]" in (tmp_path / "log.txt").read_text()
