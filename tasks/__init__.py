"""Synthetic tasks. Adding one is a module here and one line in TASKS."""

from tasks.base import Batch, Task, heldout, token_loss
from tasks.examples import Cursor, draw, draw_rows, rows
from tasks.linreg import LinReg
from tasks.mad_compression import Compression
from tasks.mad_fuzzy_recall import FuzzyInContextRecall
from tasks.mad_memorization import Memorization
from tasks.mad_recall import InContextRecall, NoisyInContextRecall
from tasks.mad_selective_copying import SelectiveCopying
from tasks.memorize import Memorize
from tasks.mqar import MQAR
from tasks.overwrite import Overwrite
from tasks.patterns import Patterns
from tasks.repeat import Repeat
from tasks.triggers import Triggers

TASKS: dict[str, type] = {
    "mqar": MQAR,
    "memorize": Memorize,
    "repeat": Repeat,
    "triggers": Triggers,
    "linreg": LinReg,
    "overwrite": Overwrite,  # MQAR with keys rewritten before the query (the note's delta-rule prediction)
    "patterns": Patterns,  # pattern completion from a corrupted cue (the note's Chapter 6, Hopfield)
    # MAD's six (Poli et al. 2024), by MAD's task names
    "mad_in_context_recall": InContextRecall,
    "mad_fuzzy_in_context_recall": FuzzyInContextRecall,
    "mad_noisy_in_context_recall": NoisyInContextRecall,
    "mad_selective_copying": SelectiveCopying,
    "mad_compression": Compression,
    "mad_memorization": Memorization,
}

__all__ = ["Batch", "Cursor", "Task", "TASKS", "draw", "draw_rows", "heldout", "rows", "token_loss"]
