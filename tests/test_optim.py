"""The learning-rate schedule: warmup, then the chosen decay."""

import numpy as np
import pytest

from tmem.config import OptimConfig
from tmem.train.optim import learning_rate


@pytest.mark.parametrize("schedule, end", [("cosine", 0.1), ("linear", 0.1), ("constant", 1.0)])
def test_warmup_then_decay(schedule, end):
    cfg = OptimConfig(lr=2e-3, warmup_steps=10, schedule=schedule, final_lr_ratio=0.1)
    lr = learning_rate(cfg, total_steps=110)
    assert float(lr(0)) == 0.0
    np.testing.assert_allclose(float(lr(5)), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(lr(10)), 2e-3, rtol=1e-6)
    np.testing.assert_allclose(float(lr(110)), 2e-3 * end, rtol=1e-5)
    assert all(float(lr(s)) >= float(lr(s + 1)) - 1e-12 for s in range(10, 110))
