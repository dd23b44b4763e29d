"""What every row's FLOP count is made of: the costs of composite functions, norms and short convolutions, and
`Uncounted`, the refusal a step without a count raises.

Each row counts its own layer in a training step, forward and backward, as
tmem.flops counts the step: its config's `flops(model, B, T, Q, input_grad,
once)` (tmem.mixers.base.MixerConfig), given the model's config, the
examples B, the length T, the read positions Q (None: all), whether the
mixer's input needs a gradient, and `once` (count each loop's body once, as
XLA's cost analysis does). The memories' own math is counted in
tmem.memory.flops, whose functions a row reaches through this module (the
rows import it as `count`); a row adds what its layer puts around its memory:
projections, short convolutions, feature maps, norms and gates. The
composite functions' costs per element (the constants below) are what XLA's
CPU cost analysis reports for each alone.

A config the count does not cover raises `Uncounted`, never a count of zero:
the token-loop forms the training forms are tested against, mesa's LAPACK
solve (which XLA counts as nothing), and a row whose config has no `flops`.
"""

from __future__ import annotations

# the memories' counts, which the rows read through this module
from tmem.memory.flops import (  # noqa: F401
    GELU, PRODUCT, chunked, elementwise, gradient_memory, matmul, recurrent, ttt_dual)
from tmem.memory.flops_mesa import chunked_cg, sums_and_solves  # noqa: F401
from tmem.memory.flops_decays import rwkv7_chunked, selective_scan  # noqa: F401


class Uncounted(ValueError):
    """A step the analytic count does not cover (a form kept only as a test oracle, a solve XLA counts as nothing,
    a row without a count): refused in one line, never counted as zero."""


# (forward, backward) FLOPs per element of composite functions, as XLA's CPU cost analysis counts each on its
# own (forward alone; then forward and backward together, minus the forward), transcendentals excluded
SILU = (4, 6)
SIGMOID = (3, 3)
SOFTPLUS = (6, 6)
LOG_SIGMOID = (8, 9)
SOFTMAX = (4, 6)
L2_NORMALIZE = (3, 5)  # tmem.layers.l2_normalize and its written-out backward
L2_UNIT = (3, 8)  # attention._unit, differentiated by XLA
FEATURE_MAPS = {"identity": (0, 0), "elu": (4, 7), "relu": (1, 2)}
# DPFP per element of its input: relu([x, -x]), then for each of its nu shifts the product of r with r rolled
# (2 elements out per element in; XLA recomputes relu(-x) inside that fusion) and the product's gradients
DPFP, DPFP_SHIFT = (3, 5), (4, 12)
# Based's Taylor map per element of its d-wide input, (1 + 2d, 1 + 5d): x / d^(1/4), then its row of x x^T and that
# row's scale; backward, the scaled gradient and x x^T's (each coordinate's gradient reads its row and column)
TAYLOR, TAYLOR_PER_KEY = (1, 1), (2, 5)
# Performer's map per token of width d into m features (XLA's count for m a multiple of 64; it counts a max over
# fewer lanes, or a backward of an odd width, a few FLOPs otherwise): forward 2dm (the projection) + 2m (the
# square's subtraction, the 1/sqrt(m)) + 4d (the scale and |x|^2); backward 2dm + 2m + 5d + 1 (the projection
# is fixed, so only x's gradient); the queries' stabiliser, a max and a subtraction, 2m - 1 more forward
PERFORMER_PER_PRODUCT, PERFORMER_PER_FEATURE, PERFORMER_PER_KEY = (2, 2), (2, 2), (4, 5)
PERFORMER_STABILISER = (2, -1)  # per feature, per token: forward only (the max's gradient is stopped)
# norms: (forward, backward with the input's gradient, backward of the scale and bias alone)
NORMS = {"layernorm": (7, 13, 4), "rmsnorm": (4, 9, 3), "none": (0, 0, 0)}


def norm(kind: str, n: int, input_grad: bool = True) -> int:
    """A norm (with its scale and bias) over n elements."""
    fwd, bwd, params_only = NORMS[kind]
    return n * (fwd + (bwd if input_grad else params_only))


def feature_map_cost(name: str, dpfp_nu: int, d_key: int) -> tuple[int, int]:
    """(forward, backward) FLOPs per element of q or k going into the feature map; DPFP's grow with its shifts,
    the Taylor map's with the key width d_key."""
    if name == "dpfp":
        return DPFP[0] + dpfp_nu * DPFP_SHIFT[0], DPFP[1] + dpfp_nu * DPFP_SHIFT[1]
    if name == "taylor":
        return TAYLOR[0] + d_key * TAYLOR_PER_KEY[0], TAYLOR[1] + d_key * TAYLOR_PER_KEY[1]
    return FEATURE_MAPS[name]


def feature_maps(name: str, tokens: int, d_key: int, dpfp_nu: int, num_features: int) -> int:
    """The feature map of q and of k over `tokens` tokens of d_key (each group's), forward and backward."""
    if name != "performer":
        return elementwise(2 * tokens * d_key, feature_map_cost(name, dpfp_nu, d_key))
    d, m = d_key, num_features
    per_token = sum(PERFORMER_PER_PRODUCT) * d * m + sum(PERFORMER_PER_FEATURE) * m + sum(PERFORMER_PER_KEY) * d + 1
    return tokens * (2 * per_token + PERFORMER_STABILISER[0] * m + PERFORMER_STABILISER[1])


def short_conv(B: int, T: int, C: int, K: int) -> int:
    """tmem.layers.causal_conv over C channels and its SiLU: K products and K - 1 sums per output; the
    written-out backward runs the filter backwards over the padded gradient and sums the kernel's gradient
    as a matmul with a row of ones."""
    forward = (2 * K - 1) * B * T * C
    backward = (2 * K - 1) * B * (T + K - 1) * C + K * B * T * C + 2 * B * T * K * C
    return forward + backward + elementwise(B * T * C, SILU)


def training_form(c, *forms: str) -> None:
    """Refuse any form but those a count is written for: the token loops the training forms are tested against
    (mesa's with a solve at each token) have none."""
    if c.run.form not in forms:
        raise Uncounted(f"mixer {c.name!r} has no FLOP count with run.form={c.run.form}")
