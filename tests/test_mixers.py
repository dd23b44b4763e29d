"""The mixer protocol (tmem/mixers/base.py): every row obeys it, and a row that leaves a part out cannot be made."""

import dataclasses

import jax
import pytest

from tmem.mixers import MIXERS, Mixer, MixerConfig, MixerState


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_every_row_extends_the_protocol(name):
    row = MIXERS[name]
    assert issubclass(row.config, MixerConfig) and issubclass(row.layer, Mixer)
    assert row.config().state_size(16, 8) >= 0


def test_a_row_without_a_state_size_or_a_call_cannot_be_made():
    @dataclasses.dataclass(frozen=True)
    class Sizeless(MixerConfig):
        pass

    class Silent(Mixer):
        def __init__(self):
            pass

    with pytest.raises(TypeError, match="state_size"):
        Sizeless()
    with pytest.raises(TypeError, match="__call__"):
        Silent()


def test_a_state_counts_its_tokens_without_being_an_array():
    state = MixerState(length=5)
    assert state.length == 5 and jax.tree.leaves(state) == []  # the count is static, not a pytree leaf
