"""Side effects live here: the train step and loop, checkpoints, tracking, the eval frame."""
