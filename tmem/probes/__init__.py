"""Probes, run by eval.py. Adding one is a module here and one line in PROBES."""

from tmem.probes import capacity, gd_match, induction, many_edits, memory_state, mlp_keys, mqar_distance, rank_one_edit
from tmem.probes import heldout
from tmem.probes.base import Probe, ProbeInput

PROBES: dict[str, Probe] = {
    "mqar_distance": mqar_distance.probe,
    "heldout": heldout.probe,
    "induction": induction.probe,
    "gd_match": gd_match.probe,
    "capacity": capacity.probe,
    "rank_one_edit": rank_one_edit.probe,
    "many_edits": many_edits.probe,
    "memory_state": memory_state.probe,
    "mlp_keys": mlp_keys.probe,
}

__all__ = ["PROBES", "Probe", "ProbeInput"]
