"""Pure JAX math of the memories: writes, reads, recurrent and parallel forms. No Flax."""

from tmem.memory.chunked import chunked
from tmem.memory.linear_state import recurrent
from tmem.memory.softmax import softmax_read

__all__ = ["chunked", "recurrent", "softmax_read"]
