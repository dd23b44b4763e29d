"""FLOPs of each mixer in a training step, forward and backward, counted as tmem.flops counts the step.

One function per row's config type (MIXER_FLOPS), each taking the config, the
examples B, the length T, the read positions Q (None: all), whether the
mixer's input needs a gradient, and `once` (count each loop's body once, as
XLA's cost analysis does). The memories' own math is counted in
tmem.memory.flops; this module adds what each layer puts around its memory:
projections, short convolutions, feature maps, norms and gates. The composite
functions' costs per element (the constants below) are what XLA's CPU cost
analysis reports for each alone.

A config the count does not cover raises `Uncounted`, never a count of zero:
the token-loop forms the training forms are tested against, mesa's LAPACK
solve (which XLA counts as nothing), and a row whose config type has no entry
in MIXER_FLOPS.
"""

from __future__ import annotations

from collections import Counter

from tmem.memory.flops import (GELU, PRODUCT, cg, chunked, elementwise, gradient_memory, key_sums, matmul, recurrent,
                               rwkv7_chunked, selective_scan, ttt_dual)
from tmem.mixers.attention import SoftmaxConfig
from tmem.mixers.fast_weight import GLA_RANK, FastWeightConfig
from tmem.mixers.hopfield import HopfieldConfig
from tmem.mixers.lsa import LSAConfig
from tmem.mixers.mamba import MambaConfig
from tmem.mixers.mesa import MesaConfig
from tmem.mixers.rwkv7 import SHIFTED, RWKV7Config
from tmem.mixers.titans import TitansConfig
from tmem.mixers.ttt import TTTConfig


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
L2_NORMALIZE = (3, 5)  # fast_weight._l2_normalize and its written-out backward
L2_UNIT = (3, 8)  # attention._unit, differentiated by XLA
SCORE_FUNCTIONS = {"linear": (0, 0), "relu": (1, 2), "relu2": (2, 5), "gelu": GELU, "swiglu": SILU}
FEATURE_MAPS = {"identity": (0, 0), "elu": (4, 7), "relu": (1, 2)}
# DPFP per element of its input: relu([x, -x]), then for each of its nu shifts the product of r with r rolled
# (2 elements out per element in; XLA recomputes relu(-x) inside that fusion) and the product's gradients
DPFP, DPFP_SHIFT = (3, 5), (4, 12)
# norms: (forward, backward with the input's gradient, backward of the scale and bias alone)
NORMS = {"layernorm": (7, 13, 4), "rmsnorm": (4, 9, 3), "none": (0, 0, 0)}


def norm(kind: str, n: int, input_grad: bool = True) -> int:
    """A norm (with its scale and bias) over n elements."""
    fwd, bwd, params_only = NORMS[kind]
    return n * (fwd + (bwd if input_grad else params_only))


def softmax_attention(cfg, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """tmem.mixers.attention: q only at the read positions, k and v everywhere (kv_heads of them),
    softmax(beta q k^T) v, and the options: q/k norms, window, length scale, sinks, output gate."""
    c, D = cfg.mixer, cfg.model.width
    H, d, R = c.heads, D // c.heads, B * (Q or T)
    E = c.kv_width(D)
    shortformer = cfg.model.positions == "shortformer"
    qk_grads = 2 if input_grad or shortformer else 1  # the positions' table trains through q's and k's input
    parts = Counter()
    parts["mixer/projections"] += (matmul(B * T, D, E, qk_grads) + matmul(R, D, D, qk_grads)
                                   + matmul(B * T, D, E, 2 if input_grad else 1) + matmul(R, D, D))
    if c.bias:
        parts["mixer/projections"] += 2 * (2 * B * T * E + R * D)
    if shortformer:  # x + positions into q and k; backward, the table's gradient summed over the batch
        parts["embed/unembed"] += 2 * B * T * D
    if c.qk_norm == "rms":
        parts["norms"] += norm("rmsnorm", B * T * E + R * D)
    elif c.qk_norm == "l2":
        parts["norms"] += elementwise(B * T * E + R * D, L2_UNIT)
    if cfg.model.positions == "rope":
        parts["mixer/memory"] += 6 * (B * T * E + R * D)  # x1 cos - x2 sin, x2 cos + x1 sin, and back
    scores = R * H * T
    columns = T + c.sinks  # a sink is one more column in each softmax
    parts["mixer/memory"] += (matmul(R * H, d, T) + matmul(R * H, T, d)
                              + elementwise(R * H * columns, SOFTMAX) + 4 * scores  # beta *, the causal where
                              + (R * T * (3 if c.window else 1) if Q else 0))  # the mask at read positions
    if c.sinks:
        parts["mixer/memory"] += R * H  # the sinks' gradient summed over the rows
    if c.length_scale == "logn":  # the logits times a factor per query, and the gradient through it
        parts["mixer/memory"] += 2 * scores
    elif c.length_scale == "ssmax":  # and the gradient of s: the product and the sum over the keys
        parts["mixer/memory"] += 4 * scores
    if c.output_gate:  # W_g x at the read positions, its activation, the product and its two gradients
        activation = SILU if c.gate_activation == "silu" else SIGMOID
        parts["mixer/projections"] += matmul(R, D, D, 2 if input_grad else 1)
        parts["mixer/gates"] += elementwise(R * D, activation) + 3 * R * D
    return parts


def hopfield(cfg, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """tmem.mixers.hopfield: the cue only at the read positions, the patterns everywhere, and `iterations`
    updates xi <- X^T softmax(beta X xi), each a softmax read unrolled (so no loop hides one from XLA)."""
    c, D = cfg.mixer, cfg.model.width
    H, d, R = c.heads, D // c.heads, B * (Q or T)
    shortformer = cfg.model.positions == "shortformer"
    grads = 2 if input_grad or shortformer else 1  # the positions' table trains through both inputs
    parts = Counter()
    parts["mixer/projections"] += matmul(B * T, D, D, grads) + matmul(R, D, D, grads) + matmul(R, D, D)
    if c.bias:
        parts["mixer/projections"] += 2 * (B * T * D + R * D)
    if shortformer:  # x + positions into both maps; backward, the table's gradient summed over the batch
        parts["embed/unembed"] += 2 * B * T * D
    scores = R * H * T
    update = matmul(R * H, d, T) + matmul(R * H, T, d) + elementwise(scores, SOFTMAX) + 4 * scores
    if c.learn_temperature:  # beta's gradient: the product with the scores and the sum over them
        update += 2 * scores
    parts["mixer/memory"] += c.iterations * update + (R * T if Q else 0)
    if c.iterations > 1:  # every later update's cue gradient adds to the X it read from
        parts["mixer/memory"] += (c.iterations - 1) * R * H * d
    return parts


def linear_self_attention(cfg, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """tmem.mixers.lsa: the prompt layout writes T - 1 tokens into a store read by every query; the causal
    layout reads the masked scores (its store is the final state, which training never reads)."""
    c, D = cfg.mixer, cfg.model.width
    H, d = c.heads, c.head_dim or D
    R = B * (Q or T)
    grads = 2 if input_grad else 1
    parts = Counter()
    parts["mixer/projections"] += (2 * matmul(B * T, D, H * d, grads) + matmul(R, D, H * d, grads)
                                   + matmul(R, H * d, D))
    if c.layout == "prompt":
        parts["mixer/memory"] += matmul(B * H * d, T - 1, d) + matmul(R * H, d, d)
    else:
        parts["mixer/memory"] += matmul(R * H, d, T) + matmul(R * H, T, d) + 2 * R * H * T + (R * T if Q else 0)
    return parts


def fast_weight(cfg, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """tmem.mixers.fast_weight: one fused projection, the short convolution, feature map, norms, gates,
    the memory (chunked, or recurrent: a scan over tokens), and the read's output norm and gate."""
    c, D = cfg.mixer, cfg.model.width
    H, G = c.heads, c.groups  # G: the heads' distinct q and k (Mamba-2's groups)
    d_key, d_phi, d_v = c.widths(D)
    N, R = B * T, B * (Q or T)
    parts = Counter()
    # q, k, v and every other map of x as one matmul over all tokens (the last layer's too: k and v need them)
    columns = 2 * G * d_key + H * d_v + H * d_v * c.output_gate + H * (c.write_strength == "sigmoid")
    columns += H * (c.decay == "scalar") + GLA_RANK * (c.decay == "vector")
    parts["mixer/projections"] += matmul(N, D, columns, 2 if input_grad else 1) + matmul(R, H * d_v, D)
    if c.short_conv:
        channels = 2 * G * d_key + H * d_v
        parts["mixer/conv"] += short_conv(B, T, channels, c.short_conv) + 2 * N * channels * c.conv_bias
    gates = elementwise(2 * N * G * d_key, feature_map_cost(c.feature_map, c.dpfp_nu))
    if c.qk_norm == "l2":
        gates += elementwise(2 * N * G * d_phi, L2_NORMALIZE)
    elif c.qk_norm == "rms":
        parts["norms"] += norm("rmsnorm", 2 * N * G * d_phi)
    if G != H:  # backward of sharing: each group's gradient summed over its heads
        gates += 2 * N * (H - G) * d_phi
    if c.q_scale != 1.0:  # XLA drops a multiplication by one
        gates += 2 * N * H * d_phi
    if c.decay == "scalar":  # dt = softplus(W x + dt_bias), log a = -exp(A_log) dt: adds, products, gradients
        gates += elementwise(N * H, SOFTPLUS) + 6 * N * H
    elif c.decay == "vector":  # log a = log_sigmoid(W2 (W1 x) + b) / 16
        gates += matmul(N, GLA_RANK, H * d_phi) + elementwise(N * H * d_phi, LOG_SIGMOID) + 4 * N * H * d_phi
    if c.write_strength == "sigmoid":
        gates += elementwise(N * H, SIGMOID)
    # the read's output: normaliser, Mamba-2's skip, the RMSNorm and the gate (either order), at the read positions
    if c.normalize:
        gates += 4 * R * H * (d_v + 1)
    if c.skip:
        gates += 5 * R * H * d_v
    if c.output_gate:
        activation = SILU if c.gate_activation == "silu" else SIGMOID
        gates += elementwise(R * H * d_v, activation) + 3 * R * H * d_v
    if c.output_norm:
        parts["norms"] += norm("rmsnorm", R * H * d_v)
    parts["mixer/gates"] += gates
    decay = {"none": None, "fixed": 1, "scalar": 1, "vector": d_phi}[c.decay]
    memory = (d_phi, d_v + c.normalize, decay, c.decay != "fixed", c.write_strength != "one", c.rule == "delta")
    reads = None if Q is None else B * Q * H
    if c.form == "chunked":
        shared = H if c.decay == "fixed" else None  # RetNet's decay: made once for the batch
        qk_heads = H if G == 1 else 1  # one group's q and k reach the memory once, broadcast over the heads
        parts["mixer/memory"] += chunked(B * H, T, *memory, c.chunk, reads, once, shared, qk_heads)
    else:
        parts["mixer/memory"] += recurrent(B * H, T, *memory, reads, once)
    return parts


def feature_map_cost(name: str, dpfp_nu: int) -> tuple[int, int]:
    """(forward, backward) FLOPs per element of q or k going into the feature map; DPFP's grow with its shifts."""
    if name == "dpfp":
        return DPFP[0] + dpfp_nu * DPFP_SHIFT[0], DPFP[1] + dpfp_nu * DPFP_SHIFT[1]
    return FEATURE_MAPS[name]


def short_conv(B: int, T: int, C: int, K: int) -> int:
    """tmem.layers.causal_conv over C channels and its SiLU: K products and K - 1 sums per output; the
    written-out backward runs the filter backwards over the padded gradient and sums the kernel's gradient
    as a matmul with a row of ones."""
    forward = (2 * K - 1) * B * T * C
    backward = (2 * K - 1) * B * (T + K - 1) * C + K * B * T * C + 2 * B * T * K * C
    return forward + backward + elementwise(B * T * C, SILU)


def training_form(c, form: str) -> None:
    """Refuse any form but the training one: the others are the token loops (mesa's with a solve at each token)
    that the training forms are tested against, and have no count."""
    if c.form != form:
        raise Uncounted(f"mixer {c.name!r} has no FLOP count with form={c.form}")


def mesa(cfg, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """tmem.mixers.mesa: q, k, v and the gates' maps, the short convolution on q and k, unit q and k, the sums
    H_t at every token, the ridge systems (H_t + Lambda) x = q solved by conjugate gradients where the layer
    reads, G read with the solutions as queries (the chunked form), each head's RMSNorm, the gate and the output
    map."""
    c, D = cfg.mixer, cfg.model.width
    training_form(c, "parallel")
    if c.solver != "cg":  # a LAPACK call, which XLA's cost analysis counts as nothing
        raise Uncounted(f"mixer {c.name!r} has no FLOP count with solver={c.solver}")
    H, d, N, R = c.heads, D // c.heads, B * T, B * (Q or T)
    gated = c.forget == "gate"
    grads = 2 if input_grad else 1
    parts = Counter()
    parts["mixer/projections"] += 3 * matmul(N, D, D, grads) + matmul(R, D, D)
    parts["mixer/projections"] += (1 + gated) * (matmul(N, D, H, grads) + 2 * N * H)  # the gates', with biases
    if c.short_conv:
        parts["mixer/conv"] += short_conv(B, T, 2 * D, c.short_conv)
    gates = elementwise(2 * N * D, L2_NORMALIZE) + elementwise(N * H, SIGMOID)
    if gated:
        gates += elementwise(N * H, LOG_SIGMOID)
    if c.output_gate:  # made at every token and read at R (reading at Q, its gradient scattered back)
        activation = SILU if c.gate_activation == "silu" else SIGMOID
        parts["mixer/projections"] += matmul(N, D, D, grads)
        gates += elementwise(R * D, activation) + 3 * R * D + (R * D if Q else 0)
    parts["mixer/gates"] += gates
    parts["norms"] += norm("rmsnorm", R * D)
    reads = B * H * (Q or T)  # the systems solved: one for each read of each head
    memory = key_sums(B * H, T, d, gated, c.chunk, once)
    # H_t + Lambda at the reads; backward, Lambda's gradient: dA times the identity, summed over the reads (and,
    # reading at Q positions, H_t's gradient scattered back)
    memory += reads * d * d * (3 + (Q is not None))
    memory += cg(reads, d, c.cg_steps, once)
    memory += chunked(B * H, T, d, d, 1, gated, True, False, c.chunk, None if Q is None else reads, once)
    parts["mixer/memory"] += memory
    return parts


def ttt(cfg, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """tmem.mixers.ttt: the shared q/k map and v's, each of q and k through its own biased convolution and RoPE
    within the mini-batch, the learned per-token rate, the memory trained by mini-batch gradient steps (the
    dual form), the read's LayerNorm over the width, its GELU gate and the output map."""
    c, D = cfg.mixer, cfg.model.width
    training_form(c, "dual")
    H, d, N, R = c.heads, D // c.heads, B * T, B * (Q or T)
    grads = 2 if input_grad else 1
    parts = Counter()
    # q/k, v and the gate (made at every token, read at R) and the rate's map; the output map
    parts["mixer/projections"] += 3 * matmul(N, D, D, grads) + matmul(N, D, H, grads) + 2 * N * H + matmul(R, D, D)
    if c.short_conv:  # two filters over the one map, with biases and no SiLU; backward, their input gradients added
        parts["mixer/conv"] += 2 * (short_conv(B, T, D, c.short_conv) - elementwise(N * D, SILU) + 2 * N * D) + N * D
    gates = 12 * N * D if c.rope else 0  # q and k: x1 cos - x2 sin, x2 cos + x1 sin, and back
    # lr = base_lr sigmoid(.) / d (XLA drops a product with one); the GELU gate, its product and two gradients
    gates += elementwise(N * H, SIGMOID) + 2 * N * H * (1 + (c.base_lr != 1.0))
    gates += elementwise(R * D, GELU) + 3 * R * D + (2 * R * D if Q else 0)  # reading at Q: two gathers' scatters
    parts["mixer/gates"] += gates
    parts["norms"] += norm("layernorm", R * D)
    if c.inner == "linear":
        parts["mixer/memory"] += ttt_dual(B * H, T, d, c.mini_batch, once)
    else:  # TTT-MLP: the gradient memory with the reading position's factor, neither decay nor momentum
        parts["mixer/memory"] += gradient_memory(B * H, T, c.mini_batch, [d, c.expansion * d, d], bias=True,
                                                 norm=True, tok=True, decay_grad=False, momentum=False, once=once)
    return parts


def titans(cfg, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """tmem.mixers.titans (and the regression grid's iterative cells): q, k, v through the short convolution
    with SiLU, unit q and k, the rates theta, eta and alpha from the token, the gradient memory (a scan over
    mini-batches), each head's RMSNorm and the output map."""
    c, D = cfg.mixer, cfg.model.width
    training_form(c, "parallel")
    H, d, N, R = c.heads, D // c.heads, B * T, B * (Q or T)
    grads = 2 if input_grad else 1
    parts = Counter()
    rates = 1 + c.momentum + (c.forget == "gate")  # theta, eta, alpha: a map of x each, with a bias
    parts["mixer/projections"] += 3 * matmul(N, D, D, grads) + rates * (matmul(N, D, H, grads) + 2 * N * H)
    parts["mixer/projections"] += matmul(R, D, D)
    if c.short_conv:
        parts["mixer/conv"] += short_conv(B, T, 3 * D, c.short_conv)
    # unit q and k; theta = base_lr sigmoid(.) / d (XLA drops a product with one); reading at Q, the read's
    # gradient scattered back
    gates = elementwise(2 * N * D, L2_NORMALIZE) + elementwise(N * H, SIGMOID) + 2 * N * H * (1 + (c.base_lr != 1.0))
    gates += R * D if Q else 0
    if c.momentum:  # log eta = log_sigmoid(.)
        gates += elementwise(N * H, LOG_SIGMOID)
    if c.forget == "gate":  # log(1 - alpha) = log_sigmoid(-.), and the negation's gradient
        gates += elementwise(N * H, LOG_SIGMOID) + 2 * N * H
    parts["mixer/gates"] += gates
    parts["norms"] += norm("rmsnorm", R * D)
    widths = [d, c.expansion * d, d] if c.function == "mlp" else [d, d]
    parts["mixer/memory"] += gradient_memory(B * H, T, c.mini_batch, widths, c.bias, c.inner_norm, tok=False,
                                             decay_grad=c.forget == "gate", momentum=c.momentum, once=once)
    return parts


def rwkv7(cfg, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """tmem.mixers.rwkv7: the token shift's six mixes, r, k and v, the low-rank maps of the decay, the rate and
    the gate, the removal and replacement keys, the memory (the chunked form), and at the read positions the
    group norm, the bonus, the gate and the output map (the reads gathered there, their gradients scattered
    back)."""
    c, D = cfg.mixer, cfg.model.width
    training_form(c, "chunked")
    H, N, R, r = c.heads, B * T, B * (Q or T), c.rank
    grads = 2 if input_grad else 1
    mixes = len(SHIFTED)
    parts = Counter()
    parts["mixer/projections"] += 3 * matmul(N, D, D, grads) + 2 * (matmul(N, D, r, grads) + matmul(N, r, D))
    parts["mixer/projections"] += matmul(R, D, r, grads) + matmul(R, r, D) + matmul(R, D, D)  # the gate, out
    # the shift x_{t-1} - x_t; the mixes x + mu (shift) and their gradients (mu's summed over the tokens, the
    # shift's and x's summed over the mixes)
    gates = 2 * N * D + mixes * N * D * 2 + mixes * N * D * 2 + (2 * mixes - 1) * N * D + (mixes - 1) * N * D
    gates += 2 * N * D + elementwise(N * D, SIGMOID) + 2 * N * D + 3 * N * r  # log w: w0 +, sigmoid, scale; tanh
    gates += 2 * N * D + elementwise(N * D, SIGMOID)  # a: a0 +, sigmoid
    gates += elementwise(N * D, PRODUCT) + N * D + elementwise(N * D, L2_NORMALIZE)  # kh = unit(k * k_k)
    gates += 10 * N * D  # kt = k * (1 + (a - 1) * k_a) and its gradients
    gates += 12 * R * D + R * D  # the bonus (r . (rho * kt)) v and its add
    gates += elementwise(R * r, SIGMOID) + elementwise(R * D, PRODUCT)  # the gate's sigmoid, o * g
    gates += 5 * R * D if Q else 0  # r, kt, v, o and the gate's mix read at Q: their gradients scattered back
    parts["mixer/gates"] += gates
    parts["norms"] += norm("layernorm", R * D)
    parts["mixer/memory"] += rwkv7_chunked(B * H, T, D // H, c.chunk, once)
    return parts


def mamba(cfg, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """tmem.mixers.mamba in its training form, the token scan: the in-projection, the convolution with its bias
    and SiLU, the maps to dt's bottleneck, B and C and from it to dt (with a bias) and softplus, A = -exp(A_log),
    the scan, and at the read positions the skip D x, the gate silu(z) and the output map. The associative scan
    (form=parallel) has no count: XLA's CPU count of it grows as T log T, its fusions recomputing the rounds."""
    c, D = cfg.mixer, cfg.model.width
    training_form(c, "scan")
    d, Ns, R_dt = c.expand * D, c.d_state, c.rank(D)
    N, R = B * T, B * (Q or T)
    parts = Counter()
    parts["mixer/projections"] += (matmul(N, D, 2 * d, 2 if input_grad else 1) + matmul(N, d, R_dt + 2 * Ns)
                                   + matmul(N, R_dt, d) + 2 * N * d + matmul(R, d, D))
    gates = elementwise(N * d, SOFTPLUS) + 3 * d * Ns  # dt's softplus; A = -exp(A_log) and its gradient
    if c.short_conv:
        parts["mixer/conv"] += short_conv(B, T, d, c.short_conv) + 2 * N * d
    else:  # x's SiLU alone
        gates += elementwise(N * d, SILU)
    gates += 5 * R * d + elementwise(R * d, SILU) + elementwise(R * d, PRODUCT)  # + D x; * silu(z)
    gates += 2 * R * d if Q else 0  # x and z read at Q: their gradients scattered back
    parts["mixer/gates"] += gates
    parts["mixer/memory"] += selective_scan(B, T, d, Ns, None if Q is None else B * Q, once)
    return parts


MIXER_FLOPS = {SoftmaxConfig: softmax_attention, LSAConfig: linear_self_attention, FastWeightConfig: fast_weight,
               HopfieldConfig: hopfield, MesaConfig: mesa, TTTConfig: ttt, TitansConfig: titans,
               RWKV7Config: rwkv7, MambaConfig: mamba}
