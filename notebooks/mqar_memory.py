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
# # What an MQAR model remembers
#
# Multi-query associative recall (`tasks/mqar.py`): key-value pairs, then the keys again, each to be answered
# with its value. This notebook reads one trained run four ways: held-out accuracy by the distance from query
# back to key, accuracy as the context holds more or fewer pairs than the run trained on, the spectrum of the
# memory the model ends a sequence with, and what one held-out sequence's read looks at. Train a run first,
# softmax attention (the default job) or a fast-weight row:
#
#     python train.py hydra.run.dir=runs/mqar
#     python train.py mixer=deltanet hydra.run.dir=runs/mqar_delta
#
# then set `run_dir` below (papermill: `-p run_dir runs/mqar_delta`). The numbers come from the code eval.py
# runs: the `mqar_distance` and `memory_state` probes, and `heldout` on the task with `task.num_kv_pairs=`
# overridden.

# %% tags=["parameters"]
run_dir = "runs/mqar"  # a training run directory of the MQAR task (the one holding checkpoints/)
step = None  # the checkpoint to read; None means the latest
seed = None  # None: the task's own held-out set, the one training evaluated; an int: held-out sequences from this key
pair_counts = None  # e.g. [1, 2, 4, 8]; None: 1, 2, 4, ... up to the most the sequence holds
seq_len = None  # the sequence length of the pair counts; None: the trained one (longer: positions rope or none)
example = 0  # the held-out sequence whose read is shown
sequences = 512  # held-out sequences for the state's spectrum

# %%
# %matplotlib inline
import jax
import numpy as np
from IPython.display import display
from matplotlib.figure import Figure

from tasks import heldout
from tmem.config import ConfigError
from tmem.probes.heads import forward_with_attention
from tmem.probes.heldout import heldout_metrics
from tmem.probes.memory_state import key_cosines_figure, memory_state, spectra_figure, written
from tmem.probes.mqar_distance import distance_figure, query_attention_figure, recall_by_distance
from tmem.train.restore import load_run
from tmem.train.task_overrides import with_task

cfg, model, step, history = load_run(run_dir, step)
if cfg.task.name != "mqar":
    raise ValueError(f"run {run_dir} trained on task {cfg.task.name!r}: this notebook reads MQAR runs")
if seed is not None:
    cfg = with_task(cfg, {"heldout_seed": seed})
task = cfg.task
batch = jax.jit(heldout, static_argnums=0)(task)
print(f"step {step}: mixer {cfg.mixer.name}, {cfg.model.depth} layer(s) of width {cfg.model.width}; "
      f"{task.num_kv_pairs} pairs in {task.seq_len} tokens, vocabulary {task.vocab}, "
      f"{task.heldout_size} held-out sequences")

# %% [markdown]
# ## Accuracy by distance
#
# Queries are bucketed by how far back their key sits, in bins [2^k, 2^(k+1)). Zoology's power-law placement
# puts most queries just after the context, so the far bins hold few: a model with a short effective memory
# fails there first.

# %%
rows = recall_by_distance(model, batch)
print(f"{'distance':>13} {'queries':>8} {'accuracy':>9} {'loss':>7}")
for low, high, n, accuracy, loss in zip(rows["distance_low"], rows["distance_high"], rows["count"],
                                        rows["accuracy"], rows["loss"]):
    print(f"{low:>5} to {high:<4} {n:8d} {accuracy:9.3f} {loss:7.3f}")
print(f"overall accuracy {rows['overall_accuracy']:.3f}")
display(distance_figure(rows))

# %% [markdown]
# ## Accuracy by pair count
#
# The trained model, unchanged, on held-out sequences holding another number of pairs (`with_task`, as
# `eval.py run=... task.num_kv_pairs=N` reads it). A sequence of T tokens holds at most T / 4 pairs, each
# shown once and queried once (fewer with `num_passes` > 1, and at most V/2 - 1 keys); the task refuses more,
# as `with_task` refuses a longer sequence than a learned position table holds. A fixed-size state fills up:
# the note puts a matrix memory's limit near d_k pairs per head.

# %%
counts = pair_counts or [2**i for i in range(16)]
length = {} if seq_len is None else {"seq_len": seq_len}
by_pairs = {}
for n in counts:
    try:
        changed = with_task(cfg, {**length, "num_kv_pairs": n}).task
    except ConfigError as e:
        print(f"{n} pairs: refused: {e}")
        if pair_counts is None:  # the powers of two stop at the first the task refuses
            break
        continue
    by_pairs[n] = heldout_metrics(model, changed)
    trained = " (as trained)" if n == task.num_kv_pairs and changed.seq_len == task.seq_len else ""
    print(f"{n:>5} pairs in {changed.seq_len} tokens: accuracy {by_pairs[n]['accuracy']:.3f}, "
          f"loss {by_pairs[n]['loss']:.3f}{trained}")
if by_pairs:
    fig = Figure(figsize=(5, 3.2), layout="constrained")
    ax = fig.subplots()
    ax.plot(list(by_pairs), [m["accuracy"] for m in by_pairs.values()], "o-")
    ax.axvline(task.num_kv_pairs, color="gray", ls=":", label="trained")
    ax.axhline(2 / task.vocab, color="gray", ls="--", label="chance (a random value)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(by_pairs), list(by_pairs))
    ax.set(xlabel="key-value pairs in the sequence", ylabel="held-out accuracy", ylim=(0, 1.05),
           title=f"recall by pair count ({seq_len or task.seq_len} tokens)")
    ax.legend(fontsize=7)
    display(fig)

# %% [markdown]
# ## The state's spectrum
#
# For every layer whose memory is a matrix (the fast-weight rows, mesa, TTT-Linear, a linear Titans, LSA), the
# `memory_state` probe's singular values of the state each held-out sequence ends with, its effective rank,
# and the mean squared cosine between the distinct keys written into it beside the 1/d_k of random keys.
# Softmax attention keeps every key and value instead, a cache that grows with the sequence: it has no
# matrix to take the spectrum of, and says so.

# %%
state = memory_state(model, batch.inputs[:sequences], task)
matrices = [r for r in state["layers"].values() if r["matrix_state"]]
for i, r in state["layers"].items():
    if not r["matrix_state"]:
        print(f"layer {i} ({r['mixer']}): {r['reason']}")
        continue
    line = (f"layer {i} ({r['mixer']}): state {r['shape'][0]} x {r['shape'][1]} per head, effective rank "
            f"{r['mean_effective_rank']:.2f}, rank90 {r['mean_rank90']:.2f}")
    if "mean_key_interference" in r:
        line += f", key interference {r['mean_key_interference']:.3f} (random keys: {r['predicted_crosstalk']:.3f})"
    print(line)
if matrices:
    display(spectra_figure(state, task.num_kv_pairs))
else:
    print("no layer's state is a matrix: no spectrum to show")

# %% [markdown]
# ## One sequence's read
#
# Softmax attention (and the Hopfield row) sow their attention weights (`attention` in the layer's `sows`): each
# query's row shows where it read, o marking its key and x the value after it. A matrix memory keeps no per-token weights; what decides its
# read of a stored key is that key's overlap with the others written (its crosstalk), shown as the cosines
# between the keys written over the context. The query vectors themselves are not sown, so the read at a query
# position is not shown for these rows. Below the figure: the model's answer at each query.

# %%
one = jax.tree.map(lambda x: x[example:example + 1], batch)
positions, distance = np.asarray(one.positions[0]), np.asarray(one.meta["distance"][0])
mixer = model.blocks[0].mixer
if matrices:
    _, keys = written(model, one.inputs)
    if any(k is not None for k in keys):
        display(key_cosines_figure(keys, task))
    else:
        print(f"{type(mixer).__name__} sows no keys: no read to show")
elif "attention" in mixer.sows:  # the layer declares it sows its weights (tmem.mixers.base.Mixer.sows)
    _, A = forward_with_attention(model, one.inputs)
    display(query_attention_figure(np.asarray(A)[:, 0], positions, distance))
else:
    print(f"{type(mixer).__name__} sows neither attention weights nor the keys of a matrix state: no read to show")

answers = np.asarray(jax.jit(lambda x, p: model(x, positions=p))(one.inputs, one.positions)[0].argmax(-1))
tokens, targets = np.asarray(one.inputs[0]), np.asarray(one.targets[0])
print(f"sequence {example}: {' '.join(map(str, tokens))}")
for j in np.argsort(positions):
    mark = "right" if answers[j] == targets[j] else "wrong"
    print(f"query at {positions[j]:>3}: key {tokens[positions[j]]} (written at {positions[j] - distance[j]}), "
          f"value {targets[j]}, answered {answers[j]}: {mark}")
