"""The fast-weight rows' FLOP count (tmem.mixers.fast_weight), beside their layer: one fused projection, the
short convolution, feature map, norms, gates, the memory (chunked, or recurrent: a scan over tokens), and the
read's output norm and gate."""

from __future__ import annotations

from collections import Counter

from tmem.mixers import flops as count

GLA_RANK = 16  # the width of GLA's low-rank gate (its layer, tmem.mixers.fast_weight, reads it from here)


def fast_weight_flops(c, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """FastWeightConfig.flops: the count of a fast-weight row `c` in `model` (tmem.mixers.base.MixerConfig)."""
    D = model.width
    H, G = c.heads, c.groups  # G: the heads' distinct q and k (Mamba-2's groups)
    d_key, d_phi, d_v = c.widths(D)
    N, R = B * T, B * (Q or T)
    parts = Counter()
    # q, k, v and every other map of x as one matmul over all tokens (the last layer's too: k and v need them)
    columns = 2 * G * d_key + H * d_v + H * d_v * c.output_gate + H * (c.write_strength == "sigmoid")
    columns += H * (c.decay == "scalar") + GLA_RANK * (c.decay == "vector")
    parts["mixer/projections"] += count.matmul(N, D, columns, 2 if input_grad else 1) + count.matmul(R, H * d_v, D)
    if c.short_conv:
        channels = 2 * G * d_key + H * d_v
        parts["mixer/conv"] += count.short_conv(B, T, channels, c.short_conv) + 2 * N * channels * c.conv_bias
    gates = count.feature_maps(c.feature_map, N * G, d_key, c.dpfp_nu, c.num_features)
    if c.qk_norm == "l2":
        gates += count.elementwise(2 * N * G * d_phi, count.L2_NORMALIZE)
    elif c.qk_norm == "rms":
        parts["norms"] += count.norm("rmsnorm", 2 * N * G * d_phi)
    if G != H:  # backward of sharing: each group's gradient summed over its heads
        gates += 2 * N * (H - G) * d_phi
    if c.q_scale != 1.0:  # XLA drops a multiplication by one
        gates += 2 * N * H * d_phi
    if c.decay == "scalar":  # dt = softplus(W x + dt_bias), log a = -exp(A_log) dt: adds, products, gradients
        gates += count.elementwise(N * H, count.SOFTPLUS) + 6 * N * H
    elif c.decay == "vector":  # log a = log_sigmoid(W2 (W1 x) + b) / 16
        gates += (count.matmul(N, GLA_RANK, H * d_phi) + count.elementwise(N * H * d_phi, count.LOG_SIGMOID)
                  + 4 * N * H * d_phi)
    if c.write_strength == "sigmoid":
        gates += count.elementwise(N * H, count.SIGMOID)
    # the read's output: normaliser, Mamba-2's skip, the RMSNorm and the gate (either order), at the read positions
    if c.normalize:
        gates += 4 * R * H * (d_v + 1)
    if c.skip:
        gates += 5 * R * H * d_v
    if c.output_gate:
        activation = count.SILU if c.gate_activation == "silu" else count.SIGMOID
        gates += count.elementwise(R * H * d_v, activation) + 3 * R * H * d_v
    if c.output_norm:
        parts["norms"] += count.norm("rmsnorm", R * H * d_v)
    parts["mixer/gates"] += gates
    decay = {"none": None, "fixed": 1, "scalar": 1, "vector": d_phi}[c.decay]
    memory = (d_phi, d_v + c.normalize, decay, c.decay != "fixed", c.write_strength != "one", c.rule == "delta")
    reads = None if Q is None else B * Q * H
    if c.run.form == "chunked":
        shared = H if c.decay == "fixed" else None  # RetNet's decay: made once for the batch
        qk_heads = H if G == 1 else 1  # one group's q and k reach the memory once, broadcast over the heads
        parts["mixer/memory"] += count.chunked(B * H, T, *memory, c.run.chunk, reads, once, shared, qk_heads)
    else:
        parts["mixer/memory"] += count.recurrent(B * H, T, *memory, reads, once)
    return parts
