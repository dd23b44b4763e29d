# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Does the trained model do gradient descent?
#
# A probe notebook for runs of the in-context regression task (`task=linreg`),
# e.g. `python train.py experiment=icl_gd`. It calls the same functions as
# `python eval.py run=<run dir> 'probes=[gd_match]'`: the model and the
# reference learners (K steps of GD, GD++, least squares) predict on the same
# held-out prompts, and we compare losses, predictions and the gradients of the
# predictions with respect to the query x_q. For a one-layer linear
# self-attention model we also look at its weight products next to
# Proposition 1 of von Oswald et al. (Chapter 11 of the note).

# %% tags=["parameters"]
run_dir = None  # a training run directory of the linreg task (the one holding checkpoints/)
step = None  # checkpoint step; None means the latest
options = {}  # gd_match options, e.g. {"fit_tasks": 1024, "max_steps": 2}

# %%
import jax
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

from tmem.probes.gd_construction import construction_applies, head_products
from tmem.probes.gd_match import figures, gd_match
from tmem.train.restore import load_run

if run_dir is None:
    raise ValueError("set run_dir to a task=linreg training run (papermill -p run_dir <dir>)")
cfg, model, step, history = load_run(run_dir, step)
print(f"step {step}: {cfg.model.depth} layer(s), mixer {cfg.mixer.name}, "
      f"d = {cfg.task.dim}, N = {cfg.task.num_examples}, format {cfg.task.format}")

# %% [markdown]
# ## The model against the learners
# Step sizes are fitted on tasks drawn from a different key than the held-out
# set. `sensitivity_cosine` near 1 and a small `prediction_diff` mean the model
# computes the same function of the prompt as the learner.

# %%
report, arrays = gd_match(model, cfg, jax.random.key(0), options)
keys = ["model_loss", "gd_loss", "eta", "sensitivity_cosine", "sensitivity_distance", "prediction_diff",
        "construction_cosine", "construction_eta", "closest_learner"]
for k in keys:
    if k in report:
        print(f"{k:>22}: {report[k]}")
print()
print(f"{'learner':>16} {'loss':>8} {'cosine':>8} {'pred diff':>10}  fitted")
for name, row in report["learners"].items():
    fitted = {k: np.round(row[k], 3).tolist() for k in ("etas", "gammas", "lam") if k in row}
    print(f"{name:>16} {row['loss']:8.4f} {row['sensitivity_cosine']:8.4f} {row['prediction_diff']:10.4f}  {fitted}")

# %%
for fig in figures(report, arrays, cfg.model.depth).values():
    display(fig)

# %% [markdown]
# ## The weights of a one-layer model
# In Flax's row convention a head reads with A = W_Q W_K^T and writes with
# B = W_V P. Proposition 1 has A = diag(I_d, 0) and B zero except its corner,
# -eta/N: the keys and queries read only x, and only the y-slot is written.

# %%
if cfg.model.depth == 1 and construction_applies(cfg) is None:
    A, B = head_products(model.blocks[0].mixer)
    fig, axes = plt.subplots(2, len(A), figsize=(3 * len(A), 6), squeeze=False)
    for h in range(len(A)):
        for row, (M, name) in enumerate(((A[h], "W_Q W_K^T"), (B[h], "W_V P"))):
            lim = np.abs(M).max()
            axes[row, h].imshow(M, cmap="RdBu", vmin=-lim, vmax=lim)
            axes[row, h].set_title(f"head {h}: {name}", fontsize=9)
            axes[row, h].set_xticks([]), axes[row, h].set_yticks([])
    fig.tight_layout()
    display(fig)
    plt.close(fig)
    print("cosine with the construction (heads summed):", round(report["construction_cosine"], 4),
          "implied step size:", round(report["construction_eta"], 3), "fitted:", round(report["eta"], 3))
else:
    print("construction comparison: only for a one-layer LSA-only model")

# %% [markdown]
# ## Out of distribution
# Both the model and GD with its in-range step size overshoot when x grows:
# the model inherits GD's failure, as von Oswald et al. report.

# %%
ood = report["ood"]
for i, s in enumerate(ood["scale"]):
    row = "  ".join(f"{k}={ood[k][i]:.4g}" for k in ood if k != "scale")
    print(f"scale {s}: {row}")
