"""Synthetic tasks. Adding one is a module here and one line in TASKS."""

from tasks.base import Batch, Task, heldout, token_loss
from tasks.memorize import Memorize
from tasks.mqar import MQAR

TASKS: dict[str, type] = {
    "mqar": MQAR,
    "memorize": Memorize,
}

__all__ = ["Batch", "Task", "TASKS", "heldout", "token_loss"]
