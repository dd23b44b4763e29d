"""Probe notebooks run end to end (papermill) against a tiny checkpoint trained in a fixture."""

import pytest

from conftest import ROOT


@pytest.mark.notebook
def test_induction_notebook_runs_on_a_tiny_run(tiny_repeat_run, tmp_path):
    import jupytext
    import nbformat
    import papermill

    source = tmp_path / "induction_heads.ipynb"
    jupytext.write(jupytext.read(ROOT / "notebooks" / "induction_heads.py"), source)
    executed = tmp_path / "executed.ipynb"
    papermill.execute_notebook(str(source), str(executed), parameters={"run_dir": str(tiny_repeat_run),
                                                                       "periods": [4, 8]},
                               kernel_name="python3", cwd=str(ROOT), progress_bar=False)
    cells = nbformat.read(executed, as_version=4).cells
    outputs = [o for c in cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "step 30:" in text and "formation step:" in text and "L0H0" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # attention patterns and the formation plot
