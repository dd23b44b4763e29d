"""Synthetic tasks. Adding one is a module here and one line in TASKS."""

from tasks.base import Batch, Task, heldout, token_loss
from tasks.linreg import LinReg
from tasks.memorize import Memorize
from tasks.mqar import MQAR
from tasks.repeat import Repeat
from tasks.triggers import Triggers

TASKS: dict[str, type] = {
    "mqar": MQAR,
    "memorize": Memorize,
    "repeat": Repeat,
    "triggers": Triggers,
    "linreg": LinReg,
}

__all__ = ["Batch", "Task", "TASKS", "heldout", "token_loss"]
