"""Formation step and loss-drop step on hand-made series with known answers."""

import numpy as np

from tmem.probes.formation import formation, formation_step, steepest_drop

STEPS = [100, 200, 300, 400, 500, 600, 700]


def test_formation_needs_three_consecutive_checkpoints():
    assert formation_step(STEPS, [0.1, 0.5, 0.3, 0.45, 0.4, 0.6, 0.2]) == 400  # 200 alone does not count
    assert formation_step(STEPS, [0.1, 0.2, 0.3, 0.3, 0.3, 0.5, 0.9]) is None  # only two at the end
    assert formation_step(STEPS, [0.5] * 7) == 100
    assert formation_step(STEPS, [0.39] * 7) is None
    assert formation_step(STEPS, [0.1, 0.25, 0.25, 0.25, 0.1, 0.1, 0.1], threshold=0.2) == 200


def test_steepest_drop_finds_the_phase_change():
    drop = steepest_drop(STEPS, [4.2, 4.1, 4.1, 2.0, 1.5, 1.4, 1.3])
    assert drop["from_step"] == 300 and drop["to_step"] == 400
    np.testing.assert_allclose(drop["slope_per_step"], -2.1 / 100)
    assert steepest_drop(STEPS, [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]) is None  # never fell
    # uneven spacing: the slope, not the raw difference, decides
    assert steepest_drop([0, 100, 1000], [5.0, 4.0, 1.0])["to_step"] == 100


def test_formation_over_a_series_of_models():
    # stand-in "models" are the measurements themselves: the induction head grows at step 300
    def measure(i):
        ind = np.array([[0.0, 0.0], [0.05, min(1.0, max(0.0, (i - 2) * 0.5))]])
        return {"induction": ind, "previous_token": np.array([[0.9, 0.1], [0.0, 0.0]]),
                "second_copy_loss": 4.0 - i * 0.5, "wo1": np.full((2, 2), 0.5),
                "wk1": np.array([[np.nan, np.nan], [1.0, 0.2]]), "wk0": np.array([[0.8, 0.0], [0.0, 0.0]])}

    losses = {100: 4.0, 200: 3.9, 300: 3.8, 400: 1.0, 500: 0.9}
    f = formation([(100 * (i + 1), i) for i in range(5)], measure, held_out_loss=losses.get)
    assert f["best_induction_score"] == [0.05, 0.05, 0.05, 0.5, 1.0]
    assert f["formation_step"] is None  # 400 and 500 are only two checkpoints
    f = formation([(100 * (i + 1), i) for i in range(6)], measure, held_out_loss=lambda s: losses.get(s, 0.8))
    assert f["formation_step"] == 400 and f["loss_drop_step"] == 400 and f["loss_drop_measured_on"] == "held_out_loss"
    assert f["max_previous_token_score"][0] == 0.9 and f["wk1"][0] == 1.0 and f["wk0"][0] == 0.8
    # without a recorded held-out loss the probe's second-copy loss stands in
    assert formation([(1, 0), (2, 1)], measure)["loss_drop_measured_on"] == "second_copy_loss"
