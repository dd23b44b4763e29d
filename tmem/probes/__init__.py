"""Probes, run by eval.py. Adding one is a module here and one line in PROBES."""

from tmem.probes import capacity, gd_match, induction, keys_move, least_squares, many_edits, memory_state
from tmem.probes import diffusion, dilution, heldout, learned_keys, mlp_keys, mqar_distance, rank_one_edit
from tmem.probes import rephrasing, roles, saturation
from tmem.probes.base import Probe, ProbeInput

PROBES: dict[str, Probe] = {
    "mqar_distance": mqar_distance.probe,
    "heldout": heldout.probe,
    "induction": induction.probe,
    "gd_match": gd_match.probe,
    "capacity": capacity.probe,
    "rank_one_edit": rank_one_edit.probe,
    "many_edits": many_edits.probe,
    "keys_move": keys_move.probe,
    "rephrasing": rephrasing.probe,
    "memory_state": memory_state.probe,
    "dilution": dilution.probe,
    "diffusion": diffusion.probe,
    "saturation": saturation.probe,
    "least_squares": least_squares.probe,
    "roles": roles.probe,
    "mlp_keys": mlp_keys.probe,
    "learned_keys": learned_keys.probe,
}

__all__ = ["PROBES", "Probe", "ProbeInput"]
