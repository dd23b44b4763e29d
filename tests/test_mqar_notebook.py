"""The MQAR memory notebook runs end to end on tiny checkpoints: a fast-weight row (the state's spectrum, the
keys' cosines) and softmax attention (no matrix state, the attention from each query)."""

from pathlib import Path

import jupytext
import nbformat
import pytest

from conftest import ROOT, TINY, compose_config, untrained_run

pytestmark = pytest.mark.notebook


def tiny_untrained(run_dir: Path, *overrides: str) -> Path:
    """A TINY MQAR run (2 pairs in 16 tokens, 2 heads of width 8), untrained: all the notebook reads."""
    return untrained_run(run_dir, compose_config([*TINY, *overrides]))


def execute(run_dir: Path, tmp_path: Path, **parameters) -> tuple[str, int]:
    """The notebook run on `run_dir`: its printed text and the number of images it displayed."""
    import papermill

    source = tmp_path / "mqar_memory.ipynb"
    nbformat.write(jupytext.read(ROOT / "notebooks" / "mqar_memory.py"), source)
    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(str(source), str(out), cwd=str(ROOT), kernel_name="python3", progress_bar=False,
                               parameters={"run_dir": str(run_dir), **parameters})
    outputs = [o for c in nbformat.read(out, 4).cells if c.cell_type == "code" for o in c.get("outputs", [])]
    return "".join(str(o.get("text", "")) for o in outputs), sum("image/png" in o.get("data", {}) for o in outputs)


def test_on_a_fast_weight_run(tmp_path):
    text, images = execute(tiny_untrained(tmp_path / "run", "mixer=deltanet"), tmp_path, example=3)
    assert "step 0: mixer deltanet, 2 layer(s) of width 16; 2 pairs in 16 tokens" in text
    assert "overall accuracy" in text
    # 1, 2 and 4 pairs fit in 16 tokens; 8 is the task's own refusal, and the powers of two stop there
    assert "1 pairs in 16 tokens: accuracy" in text and "4 pairs in 16 tokens: accuracy" in text
    assert "8 pairs: refused: task.num_kv_pairs=8: task.num_kv_pairs too large" in text and "16 pairs" not in text
    assert text.count("(FastWeight): state 8 x 8 per head, effective rank") == 2 and "key interference" in text
    assert "sequence 3:" in text and text.count("query at") == 2
    assert images == 4  # accuracy by distance, by pair count, the spectra, the keys' cosines


def test_on_a_softmax_run(tmp_path):
    text, images = execute(tiny_untrained(tmp_path / "run", "model.depth=1"), tmp_path, pair_counts=[1, 2, 3])
    assert "step 0: mixer softmax, 1 layer(s) of width 16" in text
    assert "3 pairs in 16 tokens: accuracy" in text and "refused" not in text  # the listed counts, all of them
    assert "layer 0 (SoftmaxAttention): no matrix state: a KV cache" in text
    assert "no layer's state is a matrix: no spectrum to show" in text and text.count("query at") == 2
    assert images == 3  # accuracy by distance, by pair count, the attention from each query
