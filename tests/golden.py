"""Loss, gradients and initial parameters of every mixer config, at a fixed seed and batch.

`tests/golden.npz` was recorded by `python tests/golden.py` at commit bee913c,
before the mixers and models moved onto one interface; test_golden.py holds
today's code to it, so a refactor that changes any row's math or initialisation
shows up as a failing case. Re-record only for a change meant to alter the math,
and say so in the commit. Changes since: `record_cases` added the hopfield row's
cases when the row was added (and the mesa, ttt_linear, ttt_mlp, titans, mamba, rwkv7 and mla rows' when they
were), and re-recorded tokens-mamba2 and vectors-mamba2 when the row's default became
Mamba-2's reference layer, tokens-linear and vectors-linear when linear
attention's q and k became unit vectors, the gated_deltanet cases when its
gate became a sigmoid, tokens-gla and tokens-gla-mlp when GLA's forget gate
began open (`mixer.forget_bias=4`), tokens-mamba2 when Mamba-2's A began
in (0.1, 1) (`mixer.a_range`) and again when its B and C became as wide as the
model and its values half of it (`mixer.expand=0.5`), tokens-mamba when Mamba-1's A began in (0.1, 1) and its
first steps in (0.01, 0.1); each `*-before` case holds the row's earlier
setting to the original recording (copied, not re-measured); tokens-softmax-relu3, -moe and -pkm were
recorded when those MLPs were added (MLP_SWITCHES), and tokens-performer when random-feature attention
was. The vector task's cases of rows outside VECTOR_ROWS were dropped to keep the suite within its time (their
token cases hold the same rows' math).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
from flax import nnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from conftest import TINY, TINY_LINREG, compose_config  # noqa: E402

GOLDEN = HERE / "golden.npz"
# every row's YAML; not mixer=regression, whose cells are rows (tests/test_regression.py holds each named cell
# equal to its row) and whose default is linear attention
MIXERS = sorted(p.stem for p in (HERE.parent / "configs" / "mixer").glob("*.yaml") if p.stem != "regression")
# rows recorded on the vector task too, one per kind of state (a KV cache, LSA's store, none, a fast-weight
# matrix): the token cases hold every row's math, the vector cases the backbone around a row (read-in, read-out),
# which one row of each kind covers
VECTOR_ROWS = {"softmax", "lsa", "none", "retnet"}
# A vector-task model each mixer can run: width 16 with a learned read-in (the identity read-in needs
# width = the token size, 5, which no head count of the fast-weight rows divides).
VECTOR = [*TINY_LINREG, "model.read_in=learned", "model.width=16", "model.depth=2"]


# rows whose defaults changed after the recording: the settings they had, held to the original recording.
# Mamba-2 before its reference layer: per-head B and C, no convolution bias, a per-head norm with the gate after
# it, A ~ U(1, 16), values as wide as the model; linear attention before unit q and k; Gated DeltaNet before its
# sigmoid gate; GLA before its open forget gate; Mamba-1 at the reference's A and dt
BEFORE = {"mamba2": ["mixer.qk_groups=null", "mixer.conv_bias=false", "mixer.output_norm_over=head",
                     "mixer.gate_before_norm=false", "mixer.a_range=[1,16]", "mixer.expand=1"],
          "linear": ["mixer.qk_norm=none"],
          "gated_deltanet": ["mixer.gate_activation=silu"],
          "gla": ["mixer.forget_bias=0"],
          "mamba": ["mixer.a_range=null", "mixer.dt_range=[0.001,0.1]"]}


# the MLPs added after the recording, each as a switch of the softmax model (recorded when added)
MLP_SWITCHES = {"relu3": ["mlp=relu3"], "moe": ["mlp=moe", "mlp.experts=4", "mlp.block=4"],
                "pkm": ["mlp=pkm", "mlp.keys=8", "mlp.top_k=4", "mlp.heads=2"]}

HEADLESS = {"none", "mamba"}  # rows without a heads knob


def _with_heads(base, mixer):
    """Two heads, or none for a mixer without heads (whose key the icl_gd experiment would still set for none)."""
    heads = ["~mixer.heads"] if mixer == "none" and "experiment=icl_gd" in base else []
    return [*base, f"mixer={mixer}", *(heads if mixer in HEADLESS else ["mixer.heads=2"])]


def cases() -> dict[str, list[str]]:
    """Case name -> overrides: every mixer on a token and a vector task, and the model's other switches."""
    tokens = [o for o in TINY if o != "mixer.heads=2"]
    out = {f"tokens-{m}": _with_heads(tokens, m) for m in MIXERS}
    out.update({f"vectors-{m}": _with_heads(VECTOR, m) for m in MIXERS if m in VECTOR_ROWS})
    for name, extra in {
        "rope": ["model.positions=rope"],
        "learned": ["model.positions=learned"],
        "no-positions": ["model.positions=none", "mlp=swiglu"],
        "rmsnorm-gelu": ["model.norm=rmsnorm", "mlp=gelu", "mixer.qk_norm=rms"],
        "tied-embeddings": ["model.tie_embeddings=true", "mlp=relu2"],
        "fixed-embeddings": ["model.train_embeddings=false", "mlp=linear", "mlp.bias=true"],
        **MLP_SWITCHES,
    }.items():
        out[f"tokens-softmax-{name}"] = [*tokens, "mixer.heads=2", *extra]
    out["tokens-gla-mlp"] = [*_with_heads(tokens, "gla"), "mlp=relu", "model.depth=3"]
    for row, settings in BEFORE.items():  # each row as it was recorded, kept as a setting
        out[f"tokens-{row}-before"] = [*out[f"tokens-{row}"], *settings]
    out["vectors-lsa-identity"] = list(TINY_LINREG)
    out["vectors-lsa-tied"] = [*TINY_LINREG, "model.depth=3", "model.tie_blocks=true", "mixer.init_scale=0.1"]
    out["vectors-softmax-garg"] = [*_with_heads(VECTOR, "softmax"), "task.format=garg", "task.score=every",
                                   "model.positions=shortformer"]
    return out


def model_for(cfg):
    """The model a config builds, at the run's seed, as training builds it."""
    from tmem.train.build import build

    return build(cfg).model


def measure(overrides: list[str]) -> dict[str, np.ndarray]:
    """{"loss": ..., "grad/<path>": ..., "param/<path>": ...} of one case, computed under jit.

    Gradients are kept whole; a parameter only as its sum and norm (float64), which is
    enough to tell a changed initialisation from changed math.
    """
    from tmem.config import validate

    cfg = validate(compose_config(overrides))
    model = model_for(cfg)
    batch = cfg.task.sample(jax.random.key(11), 8)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def loss_and_grads(params, rest, batch):
        def loss(params):
            m = nnx.merge(graphdef, params, rest)
            return cfg.task.loss(m(batch.inputs, positions=batch.positions), batch)[0]
        return jax.value_and_grad(loss)(params)

    loss, grads = loss_and_grads(params, rest, batch)
    out = {"loss": np.asarray(loss)}
    for prefix, tree in (("grad", grads), ("param", params)):
        flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(tree))[0]
        for path, leaf in flat:
            leaf = np.asarray(leaf)
            if prefix == "param":
                leaf = np.array([leaf.sum(dtype=np.float64), np.linalg.norm(leaf.astype(np.float64))])
            out[f"{prefix}/" + "/".join(str(getattr(k, "key", k)) for k in path)] = leaf
    return out


def record(path: Path = GOLDEN) -> None:
    arrays = {}
    for case, overrides in cases().items():
        for key, value in measure(overrides).items():
            arrays[f"{case}|{key}"] = value
        print(case, float(arrays[f"{case}|loss"]))
    np.savez_compressed(path, **arrays)
    print(f"wrote {len(arrays)} arrays to {path}")


def record_cases(names: list[str], path: Path = GOLDEN, copies: dict[str, str] | None = None) -> None:
    """Re-record only the named cases (and copy a recorded case's arrays to a new name, copies: new -> old),
    leaving every other case's arrays as they were, bit for bit."""
    recorded = dict(np.load(path))
    for new, old in (copies or {}).items():
        recorded.update({f"{new}|{k.split('|', 1)[1]}": v for k, v in recorded.items() if k.startswith(f"{old}|")})
    for case in names:
        recorded = {k: v for k, v in recorded.items() if not k.startswith(f"{case}|")}
        recorded.update({f"{case}|{key}": value for key, value in measure(cases()[case]).items()})
        print(case, float(recorded[f"{case}|loss"]))
    np.savez_compressed(path, **recorded)
    print(f"wrote {len(recorded)} arrays to {path}")


if __name__ == "__main__":
    # python tests/golden.py: every case afresh; python tests/golden.py CASE ...: only those
    if sys.argv[1:]:
        record_cases(sys.argv[1:])
    else:
        record()
