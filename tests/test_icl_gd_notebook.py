"""The gd_match notebook runs end to end on a tiny checkpoint."""

import jupytext
import nbformat
import pytest

from conftest import ROOT, TINY_LINREG, run_entry

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def linreg_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("linreg_run")
    done = run_entry("train.py", *TINY_LINREG, "train.steps=30", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_icl_gd_notebook_runs(linreg_run, tmp_path):
    import papermill

    source = tmp_path / "icl_gd.ipynb"
    nbformat.write(jupytext.read(ROOT / "notebooks" / "icl_gd.py"), source)
    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(str(source), str(out), cwd=str(ROOT), kernel_name="python3", progress_bar=False,
                               parameters={"run_dir": str(linreg_run),
                                           "options": {"fit_tasks": 512, "gdpp_fit_tasks": 256, "max_steps": 2,
                                                       "ood_scales": [1.0, 2.0]}})
    text = "".join(str(o.get("text", "")) for c in nbformat.read(out, 4).cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    assert "step 30: 1 layer(s), mixer lsa" in text
    assert "sensitivity_cosine" in text and "least_squares" in text and "scale 2.0" in text
