"""Pure JAX math of the memories: writes, reads, recurrent and parallel forms. No Flax."""

from tmem.memory.softmax import softmax_read

__all__ = ["softmax_read"]
