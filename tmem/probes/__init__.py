"""Probes, run by eval.py. Adding one is a module here and one line in PROBES."""

from tmem.probes import gd_match, induction, mqar_distance
from tmem.probes.base import Probe, ProbeInput

PROBES: dict[str, Probe] = {
    "mqar_distance": mqar_distance.probe,
    "induction": induction.probe,
    "gd_match": gd_match.probe,
}

__all__ = ["PROBES", "Probe", "ProbeInput"]
