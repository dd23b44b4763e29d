"""The rank-one edit probe: both edits write the fact; the whitened one moves the others least."""

import jax
import numpy as np
import pytest

from conftest import compose_config
from tmem.config import validate
from tmem.model import build_model
from tmem.probes import PROBES, ProbeInput
from tmem.probes.rank_one_edit import memory_of
from tmem.schema import LoggerConfig

SMALL = ["experiment=memorize", "task.num_facts=64", "task.num_values=4", "task.seq_len=16", "train.batch_size=4",
         "mlp.expansion=2", "logger=disabled"]


def test_edits_write_the_fact_and_the_whitened_one_moves_other_outputs_least():
    cfg = validate(compose_config(SMALL))
    model = build_model(cfg, cfg.task)  # untrained: the facts it stores by chance are the ones edited
    before = np.asarray(model.blocks[0].mlp.w_out.kernel[...])
    metrics, figures = PROBES["rank_one_edit"].run(ProbeInput(cfg=cfg, model=model, key=jax.random.key(0),
                                                              options={"edits": 4, "steps": 100}))
    assert metrics["edits"] == 4 and metrics["stored_before"] >= 4
    assert metrics["whitened"]["success"] == metrics["plain"]["success"] == 1.0
    # Both edits give the fact the same output, and the whitened edit is the least change of the
    # outputs summed over all facts (C is their second moment), so over the other facts too.
    assert metrics["whitened"]["output_change"] < metrics["plain"]["output_change"]
    np.testing.assert_array_equal(np.asarray(model.blocks[0].mlp.w_out.kernel[...]), before)  # model untouched
    assert "rank_one_edit" in figures


def test_memory_keys_are_the_hidden_activations_read_by_w_out():
    cfg = validate(compose_config(SMALL))
    model = build_model(cfg, cfg.task)
    from tasks import heldout

    batch = heldout(cfg.task)
    H, W, with_kernel = memory_of(model, batch)
    x = model.blocks[0].mlp_norm(model.embed(batch.inputs)).reshape(-1, cfg.model.width)
    np.testing.assert_allclose(H @ W, model.blocks[0].mlp(x), rtol=1e-4, atol=1e-5)
    edited = with_kernel(W * 0.0)
    assert float(np.abs(np.asarray(edited.blocks[0].mlp.w_out.kernel[...])).max()) == 0.0
    assert float(np.abs(np.asarray(model.blocks[0].mlp.w_out.kernel[...])).max()) > 0.0


def test_probe_refuses_runs_it_cannot_read():
    cfg = validate(compose_config(["logger=disabled"]))
    assert "memorize" in PROBES["rank_one_edit"].applies(cfg)
    assert "no MLP" in PROBES["rank_one_edit"].applies(validate(compose_config(SMALL + ["mlp=none"])))
    assert "mixer=none" in PROBES["rank_one_edit"].applies(validate(compose_config(SMALL + ["mixer=softmax",
                                                                                            "model.positions=none"])))


@pytest.mark.slow
def test_on_a_trained_memory_the_whitened_edit_loses_fewer_facts(tmp_path):
    from omegaconf import OmegaConf

    from tmem.train.evaluate import evaluate
    from tmem.train.loop import run

    raw = compose_config(["experiment=memorize", "task.num_facts=256", "task.num_values=16", "train.batch_size=8",
                          "mlp.expansion=4", "train.steps=600", "logger=disabled"])
    summary = run(validate(raw), tmp_path, OmegaConf.to_container(raw, resolve=True))
    assert summary["eval/accuracy"] > 0.9
    report = evaluate(str(tmp_path), ["rank_one_edit"], out_dir=tmp_path / "eval", logger=LoggerConfig(mode="disabled"),
                      options={"rank_one_edit": {"edits": 16}})["rank_one_edit"]
    assert report["whitened"]["success"] == report["plain"]["success"] == 1.0
    assert report["whitened"]["facts_lost"] < report["plain"]["facts_lost"]


def test_many_edits_land_every_fact_at_once_and_one_edit_is_the_rank_one_edit():
    from tmem.config import ConfigError

    cfg = validate(compose_config(SMALL))
    model = build_model(cfg, cfg.task)  # untrained: 32 hidden units, so 4 keys are independent
    metrics, figures = PROBES["many_edits"].run(ProbeInput(cfg=cfg, model=model, key=jax.random.key(0),
                                                           options={"counts": [1, 2, 4], "steps": 100}))
    assert metrics["counts"] == [1, 2, 4] and "many_edits" in figures
    memit, sequential = metrics["memit"], metrics["sequential"]
    assert [r["efficacy"] for r in memit] == [1.0, 1.0, 1.0]  # lam = 0.01 against h^T C^-1 h of about 32
    assert memit[0] == pytest.approx(sequential[0], rel=1e-3)  # one edit: both are the whitened rank-one edit
    assert all(0.0 <= r["damage"] <= 1.0 for r in memit + sequential)
    with pytest.raises(ConfigError, match="options.many_edits.counts"):
        PROBES["many_edits"].run(ProbeInput(cfg=cfg, model=model, key=jax.random.key(0), options={"counts": [0]}))
