"""Probes, run by eval.py. Adding one is a module here and one line in PROBES."""

from tmem.probes import capacity, gd_match, induction, least_squares, many_edits, memory_state, mqar_distance
from tmem.probes import rank_one_edit, roles
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
    "least_squares": least_squares.probe,
    "roles": roles.probe,
}

__all__ = ["PROBES", "Probe", "ProbeInput"]
