"""The eval frame's checks: probes are named, exist and apply before anything runs."""

from types import SimpleNamespace

import pytest

from tmem.config import ConfigError
from tmem.probes import PROBES
from tmem.train.evaluate import select_probes

ALLOWED = ", ".join(PROBES)

MQAR_RUN = SimpleNamespace(task=SimpleNamespace(name="mqar"))
OTHER_RUN = SimpleNamespace(task=SimpleNamespace(name="repeat"))


def test_known_applicable_probes_pass():
    assert select_probes(["mqar_distance"], MQAR_RUN) == ["mqar_distance"]


ALLOWED = ", ".join(PROBES)  # every registered probe, in registry order


@pytest.mark.parametrize("names, cfg, message", [
    ([], MQAR_RUN, f"probes: name at least one; allowed: {ALLOWED}"),
    (["nope"], MQAR_RUN, f"probes: unknown probe 'nope'; allowed: {ALLOWED}"),
    (["mqar_distance"], None, "probe 'mqar_distance' needs a trained model: pass run=<run dir>"),
    (["mqar_distance"], OTHER_RUN, "probe 'mqar_distance' does not apply to this run: needs an MQAR run, not 'repeat'"),
])
def test_each_problem_is_one_line(names, cfg, message):
    with pytest.raises(ConfigError) as e:
        select_probes(names, cfg)
    assert str(e.value) == message
