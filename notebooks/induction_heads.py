# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Induction heads in a trained run
#
# Which heads of a run are induction heads, what their attention looks like on
# repeated random tokens, and at which step they formed. Train a run first:
#
#     python train.py experiment=induction_heads hydra.run.dir=runs/ih
#
# then set `run_dir` below (papermill: `-p run_dir runs/ih`). Every number
# here comes from `tmem.probes.induction`, the same code `eval.py` runs.

# %% tags=["parameters"]
run_dir = "runs/ih"  # a training run directory (the one holding checkpoints/)
step = None  # the checkpoint to read; None means the latest
periods = [10, 20]  # lengths of the repeated segment R in [BOS] + R + R
seed = 0

# %%
# %matplotlib inline
import jax
from IPython.display import display

from tmem.probes.formation import formation_figure
from tmem.probes.induction import analyse, formation_over_run
from tmem.probes.induction_figures import attention_figure
from tmem.train.restore import load_run

cfg, model, step, history = load_run(run_dir, step)
report, found = analyse(model, cfg.task, jax.random.key(seed), {"periods": periods})
print(f"step {step}: {report['verdict']}")
print("induction heads:", report["induction_heads"], " previous-token heads:", report["previous_token_heads"])

# %% [markdown]
# ## Scores per head
#
# Rows are layers, columns heads. Prefix matching (induction) is the attention
# from the second copy to the token after the earlier occurrence; 0.4 is the
# usual threshold, about 1/position is chance.

# %%
for name in ("induction", "duplicate", "previous_token", "copying_positivity"):
    print(f"{name:>20}:", report["heads"][name])
print(f"second-copy loss {report['second_copy_loss']:.3f} nats, first-copy {report['first_copy_loss']:.3f}, "
      f"ln V = {report['log_vocab']:.3f}")

# %% [markdown]
# ## Attention patterns of the heads it found

# %%
display(attention_figure(model, found))

# %% [markdown]
# ## Ablations: zero one head, or a layer, and re-read the best induction head

# %%
for row in report["ablation"]:
    print(f"{row['ablated']:>22}: induction {row['induction_score']:.2f} ({row['induction_score_change']:+.2f}), "
          f"second-copy loss {row['second_copy_loss']:.2f} ({row['second_copy_loss_change']:+.2f})")

# %% [markdown]
# ## Formation over training
#
# Every saved checkpoint, probed the same way; the formation step is the first
# checkpoint from which the best head stays at or above the threshold for three
# checkpoints in a row.

# %%
if len(history.steps) >= 2:
    f = formation_over_run(history, found["probes"])
    print(f"formation step: {f['formation_step']}; steepest loss drop ends at step {f['loss_drop_step']}")
    display(formation_figure(f))
else:
    print("only one checkpoint: train with train.keep_checkpoints=null to see formation")
