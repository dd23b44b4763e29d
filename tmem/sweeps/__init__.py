"""Sweep gatherers: read a Hydra multirun's finished runs into a CSV table and a figure."""
