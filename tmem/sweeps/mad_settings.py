"""MAD's settings: each task's baseline and its harder variants, one change at a time, and their training length.

MAD (Poli et al. 2024, athms/mad-lab `configs/tasks/*.yml`; anchors/zoology-mad.md
section 3) scores a model on six tasks. Each task has a baseline and a list of
"changes" (vocabulary size, sequence length, training-set size, and a
task-specific knob); every setting is the baseline with exactly one field
changed, so a task's score averages over how it degrades. Every setting
trains for 200 epochs of its own training set at batch 128, so a smaller
training set also means fewer steps.

The fields here are tmem's task fields (configs/task/mad_*.yaml), which keep
MAD's meanings: `vocab` counts every token (for noisy recall, the 16 noise
tokens too, as MAD's `vocab_size` does), and `train_examples` is MAD's
`num_train_examples`.

The reduced protocol (`--reduced`) is what fits the 2-core CPU in under 30
minutes per mixer (softmax: 23 minutes with the cores shared, load average
5): each task's baseline only, at a shorter sequence where MAD's is long, at
batch 32, for 160 steps (0.4 epoch of the 12,800-example tasks, 20 epochs of
memorization's 256), keeping the 3 x 2 grid, tested once at the end. It
ranks mixers by how fast they start to learn each task, not by what they
finally reach: no task is solved in 160 steps at MAD's rates.
"""

from __future__ import annotations

import math
from typing import NamedTuple

LRS = (1e-4, 5e-4, 1e-3)  # MAD's grid (mad/configs.py make_benchmark_mad_configs)
WEIGHT_DECAYS = (0.0, 0.1)
EPOCHS = 200
BATCH = 128
TRAIN_EXAMPLES = (6400, 3200, 1600, 800)  # the training-set change shared by five tasks


class Task(NamedTuple):
    label: str  # MAD's name for it, the score table's row
    name: str  # tmem's task (configs/task/<name>.yaml)
    baseline: dict  # tmem task fields of MAD's baseline
    changes: dict  # field -> the harder values, each tried alone


TASKS = (
    Task("in-context-recall", "mad_in_context_recall",
         {"vocab": 16, "seq_len": 128, "train_examples": 12800},
         {"vocab": (32, 64, 128), "seq_len": (256, 512, 1024), "train_examples": TRAIN_EXAMPLES}),
    Task("fuzzy-in-context-recall", "mad_fuzzy_in_context_recall",
         {"vocab": 16, "seq_len": 128, "k_motif_size": 3, "v_motif_size": 3, "train_examples": 12800},
         {"vocab": (32, 64, 128), "seq_len": (256, 512, 1024), "train_examples": TRAIN_EXAMPLES}),
    Task("noisy-in-context-recall", "mad_noisy_in_context_recall",
         {"vocab": 32, "noise_vocab_size": 16, "seq_len": 128, "frac_noise": 0.2, "train_examples": 12800},
         {"vocab": (48, 80, 144), "seq_len": (256, 512, 1024), "train_examples": TRAIN_EXAMPLES,
          "frac_noise": (0.4, 0.6, 0.8)}),
    Task("selective-copying", "mad_selective_copying",
         {"vocab": 16, "seq_len": 256, "num_tokens_to_copy": 16, "train_examples": 12800},
         {"vocab": (32, 64, 128), "seq_len": (512, 1024), "train_examples": TRAIN_EXAMPLES,
          "num_tokens_to_copy": (32, 64, 96)}),
    Task("compression", "mad_compression",
         {"vocab": 16, "seq_len": 32, "train_examples": 12800},
         {"vocab": (32, 64, 128), "seq_len": (64, 128, 256), "train_examples": TRAIN_EXAMPLES}),
    Task("memorization", "mad_memorization",
         {"vocab": 256, "seq_len": 32, "train_examples": 256},
         {"vocab": (512, 1024, 2048, 4096, 8192)}),
)

# The reduced protocol: what changes in each task's baseline (the sequence, where MAD's is longer than 32
# tokens: selective copying needs more than 2 x 16 + 1) and how long each job trains.
REDUCED_FIELDS = {"in-context-recall": {"seq_len": 32}, "fuzzy-in-context-recall": {"seq_len": 32},
                  "noisy-in-context-recall": {"seq_len": 32}, "selective-copying": {"seq_len": 64}}
REDUCED_BATCH = 32
REDUCED_STEPS = 160


class Setting(NamedTuple):
    task: str  # Task.label
    name: str  # tmem's task
    label: str  # "baseline", or the one change as "field-value" (a directory name)
    fields: dict  # every task field the setting sets
    epochs: float  # passes over its training set


class Plan(NamedTuple):
    """How every job of a protocol trains: its batch, its grid, and how often it is tested."""

    batch_size: int = BATCH
    lrs: tuple = LRS
    weight_decays: tuple = WEIGHT_DECAYS
    eval_epochs: float | None = 1.0  # test every this many epochs (MAD: every epoch); None: at the end only
    min_eval_every: int = 50  # but no more often than this many steps: a test costs about 10 training steps


FULL, REDUCED = Plan(), Plan(batch_size=REDUCED_BATCH, eval_epochs=None)


def settings(reduced: bool = False) -> list[Setting]:
    """Every setting of MAD's protocol, in MAD's order: per task, the baseline, then each change alone."""
    if reduced:
        return [reduced_baseline(t) for t in TASKS]
    out = []
    for t in TASKS:
        out.append(Setting(t.label, t.name, "baseline", dict(t.baseline), EPOCHS))
        for field, values in t.changes.items():
            out += [Setting(t.label, t.name, f"{field}-{v}", {**t.baseline, field: v}, EPOCHS) for v in values]
    return out


def reduced_baseline(t: Task) -> Setting:
    """A task's baseline shortened to REDUCED_STEPS steps at REDUCED_BATCH, at the reduced sequence length."""
    fields = {**t.baseline, **REDUCED_FIELDS.get(t.label, {})}
    return Setting(t.label, t.name, "baseline", fields, REDUCED_STEPS * REDUCED_BATCH / fields["train_examples"])


def train_steps(train_examples: int, epochs: float, batch_size: int) -> int:
    """Steps for `epochs` passes over the training set: MAD's loader ends each epoch with a short batch,
    tmem's stream straddles epochs, so this counts examples, rounded up to whole batches."""
    return max(1, math.ceil(round(epochs * train_examples, 6) / batch_size))


def eval_every(setting: Setting, plan: Plan) -> int:
    """Steps between tests: once per `plan.eval_epochs` epochs (at least `plan.min_eval_every` steps apart),
    or only at the end."""
    steps = train_steps(setting.fields["train_examples"], setting.epochs, plan.batch_size)
    if plan.eval_epochs is None:
        return steps
    epoch = train_steps(setting.fields["train_examples"], plan.eval_epochs, plan.batch_size)
    return min(steps, max(epoch, plan.min_eval_every))
