"""Does a model trained on in-context regression do gradient descent? (von Oswald et al. §3)

The reference learners of tmem/probes/learners.py are fitted on one set of
tasks and run, with the model, on the held-out tasks. Against each learner the
probe reports (mean over tasks):

* the loss (half MSE on y_q) of both;
* prediction_diff: RMS(model - learner) / RMS(learner), and prediction_diff_abs,
  the mean |model - learner| von Oswald report as "preds diff";
* sensitivity_cosine: the cosine between d prediction / d x_q of the model and
  of the learner ("model cos"); sensitivity_distance: the distance between the
  two divided by the learner's norm, so thresholds do not depend on the scale;
* for a one-layer LSA, the cosine between its weight products and
  Proposition 1 (tmem/probes/gd_construction.py);
* the same metrics with x scaled beyond the training range (ood), GD keeping the
  step size fitted in range.

Top-level keys compare with GD of as many steps as the model has layers.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tmem.probes import learners as L
from tmem.probes.base import Probe, ProbeInput
from tmem.probes.gd_construction import construction_alignment, construction_applies

DEFAULTS = {
    "tasks": None,  # held-out tasks to evaluate on; None = all of the task's held-out set
    "fit_tasks": 4096,  # tasks the step sizes are fitted on (a key disjoint from the held-out seed)
    "gdpp_fit_tasks": 2048,  # of those, the ones GD++ is fitted on (its fit is the slow part); the rest
    # choose between the per-layer fit's starts
    "max_steps": 3,  # GD and GD++ of 1..max(max_steps, depth) steps for the loss-vs-K figure
    "ood_scales": [0.5, 1.0, 1.5, 2.0, 3.0],  # multiples of task.input_range
}


@dataclasses.dataclass(frozen=True)
class Prompts:
    x: jax.Array  # [B, N+1, d], the query last
    y: jax.Array  # [B, N+1]
    w: jax.Array  # [B, d], the teachers

    @classmethod
    def sample(cls, task, key, n: int) -> "Prompts":
        batch = _sample(task, key, n)
        return cls(batch.meta["x"], batch.meta["y"], batch.meta["w"])

    def scaled(self, s: float) -> "Prompts":
        """The same tasks with every x times s (labels follow, noise stays): out of the training range."""
        clean = jnp.einsum("bnd,bd->bn", self.x, self.w)
        return Prompts(s * self.x, self.y + (s - 1.0) * clean, self.w)

    @property
    def parts(self):
        """(X, Y, x_q, y_q) as the learners take them."""
        return self.x[:, :-1], self.y[:, :-1], self.x[:, -1], self.y[:, -1]


@partial(jax.jit, static_argnums=(0, 2))
def _sample(task, key, n: int):
    return task.sample(key, n)


def model_outputs(model, task, prompts: Prompts, chunk: int = 2000):
    """The model's predictions of y_q [B] and their gradients with respect to x_q [B, d]."""
    graphdef, state = nnx.split(model)
    outs = [_model_outputs(graphdef, task, state, prompts.x[i:i + chunk], prompts.y[i:i + chunk])
            for i in range(0, prompts.x.shape[0], chunk)]
    return tuple(np.concatenate([np.asarray(o[j]) for o in outs]) for j in (0, 1))


@partial(jax.jit, static_argnums=(0, 1))
def _model_outputs(graphdef, task, state, x, y):
    model = nnx.merge(graphdef, state)

    def predict(xq):
        inputs, positions = task.prompt(x.at[:, -1].set(xq), y)
        return model(inputs, positions=positions[:, -1:])[:, 0]

    pred, pullback = jax.vjp(predict, x[:, -1])
    return pred, pullback(jnp.ones_like(pred))[0]


def compare(pred, sens, ref_pred, ref_sens) -> dict:
    """Agreement of a model's predictions and sensitivities with a reference learner's."""
    pred, sens, ref_pred, ref_sens = (np.asarray(a, np.float64) for a in (pred, sens, ref_pred, ref_sens))
    norm, ref_norm = np.linalg.norm(sens, axis=-1), np.linalg.norm(ref_sens, axis=-1)
    tiny = 1e-12 * max(float(ref_norm.mean()), 1e-30)
    return {
        "prediction_diff": float(np.sqrt(np.mean((pred - ref_pred) ** 2) / np.mean(ref_pred**2))),
        "prediction_diff_abs": float(np.mean(np.abs(pred - ref_pred))),
        "sensitivity_cosine": float(np.mean(np.sum(sens * ref_sens, -1) / (norm * ref_norm + tiny))),
        "sensitivity_distance": float(np.mean(np.linalg.norm(sens - ref_sens, axis=-1) / (ref_norm + tiny))),
    }


def fit_learners(fit: Prompts, max_steps: int, depth: int, gdpp_tasks: int, noise_std: float) -> dict:
    """Each learner's name -> its fitted parameters (a predict function's arguments)."""
    X, Y, xq, yq = fit.parts
    eta_1 = float(L.one_step_eta(X, Y, xq, yq))
    learners = {"gd_1": {"etas": [eta_1], "gammas": None}}
    small = tuple(a[:gdpp_tasks] for a in fit.parts)
    rest = tuple(a[gdpp_tasks:] for a in fit.parts) if fit.x.shape[0] > gdpp_tasks else None
    for k in range(2, max(max_steps, depth) + 1):
        eta = L.search_eta(X, Y, xq, yq, k, eta_max=2 * eta_1)
        learners[f"gd_{k}"] = {"etas": [eta] * k, "gammas": None}
        etas, gammas = L.fit_gdpp(*small, [eta] * k, [0.0] * k, per_layer=False)
        learners[f"gdpp_{k}"] = {"etas": etas.tolist(), "gammas": gammas.tolist()}
        if k == depth:
            etas, gammas = L.fit_gdpp_layers(small, float(etas[0]), float(gammas[0]), k, validation=rest)
            learners[f"gdpp_layers_{k}"] = {"etas": etas.tolist(), "gammas": gammas.tolist()}
    learners["least_squares"] = {"lam": 0.0}
    if noise_std > 0:
        learners["ridge"] = {"lam": noise_std**2}  # the posterior mean under w ~ N(0, I)
    return learners


def predict(params: dict, prompts: Prompts):
    """A learner's predictions [B] and sensitivities [B, d]."""
    X, Y, xq, _ = prompts.parts
    if "lam" in params:
        return L.ridge(X, Y, xq, params["lam"])
    gammas = params["gammas"]
    etas = jnp.asarray(params["etas"], jnp.float32)
    return tuple(np.asarray(a) for a in _token_outputs(X, Y, xq, etas, None if gammas is None else jnp.asarray(gammas)))


@jax.jit
def _token_outputs(X, Y, xq, etas, gammas):
    f = lambda q: L.token_gd(X, Y, q, etas, gammas)  # noqa: E731
    return f(xq), L.sensitivity(f, xq)


def _loss(pred, yq) -> float:
    return float(0.5 * np.mean((np.asarray(pred, np.float64) - np.asarray(yq, np.float64)) ** 2))


def gd_match(model, cfg, key, options: dict | None = None) -> tuple[dict, dict]:
    """The probe's metrics (see the module docstring) and the arrays its figures draw."""
    opts = {**DEFAULTS, **(options or {})}
    task, depth = cfg.task, cfg.model.depth
    evals = Prompts.sample(task, jax.random.key(task.heldout_seed), opts["tasks"] or task.heldout_size)
    fit = Prompts.sample(task, key, opts["fit_tasks"])
    learners = fit_learners(fit, opts["max_steps"], depth, opts["gdpp_fit_tasks"], task.noise_std)
    yq = np.asarray(evals.y[:, -1])
    pred, sens = model_outputs(model, task, evals)
    report = {"model_loss": _loss(pred, yq), "zero_loss": _loss(0.0 * yq, yq), "gd_steps": depth}
    rows, preds = {}, {}
    for name, params in learners.items():
        p, s = predict(params, evals)
        preds[name] = p
        rows[name] = {"loss": _loss(p, yq), **{k: v for k, v in params.items() if v is not None},
                      **compare(pred, sens, p, s)}
    gd = rows[f"gd_{depth}"]
    report.update(gd_loss=gd["loss"], eta=gd["etas"][0], **{k: gd[k] for k in (
        "sensitivity_cosine", "sensitivity_distance", "prediction_diff", "prediction_diff_abs")})
    for kind in ("gdpp", "gdpp_layers") if depth > 1 else ():
        row = rows[f"{kind}_{depth}"]
        report.update({f"{kind}_{k}": row[k] for k in ("loss", "sensitivity_cosine", "prediction_diff")})
    # by predictions, not cosines: a K-layer model can point where K-step GD points with another length
    report["closest_learner"] = min(rows, key=lambda n: rows[n]["prediction_diff"])
    one_layer_lsa = depth == 1 and construction_applies(cfg) is None
    report.update(construction_alignment(model, cfg) if one_layer_lsa else {"construction_cosine": None})
    report["learners"] = rows
    steps = list(range(1, max(opts["max_steps"], depth) + 1))
    report["loss_vs_steps"] = {"steps": steps, "gd": [rows[f"gd_{k}"]["loss"] for k in steps],
                               "gdpp": [rows[f"gdpp_{k}" if k > 1 else "gd_1"]["loss"] for k in steps]}
    report["ood"] = ood(model, cfg, learners, opts["ood_scales"], evals)
    return report, {"model": pred, "learners": preds, "y": yq}


def ood(model, cfg, learners: dict, scales, evals: Prompts) -> dict:
    """Loss and alignment with x scaled by each factor, GD keeping its in-range step size (von Oswald A.2)."""
    depth = cfg.model.depth
    names = [f"gd_{depth}"] + ([f"gdpp_{depth}", f"gdpp_layers_{depth}"] if depth > 1 else [])
    out = {"scale": list(scales), "model_loss": []}
    for name in names:
        out.update({f"{name}_loss": [], f"{name}_sensitivity_cosine": [], f"{name}_prediction_diff": []})
    for s in scales:
        prompts = evals.scaled(s)
        yq = np.asarray(prompts.y[:, -1])
        pred, sens = model_outputs(model, cfg.task, prompts)
        out["model_loss"].append(_loss(pred, yq))
        for name in names:
            p, g = predict(learners[name], prompts)
            c = compare(pred, sens, p, g)
            out[f"{name}_loss"].append(_loss(p, yq))
            out[f"{name}_sensitivity_cosine"].append(c["sensitivity_cosine"])
            out[f"{name}_prediction_diff"].append(c["prediction_diff"])
    return out


def figures(report: dict, arrays: dict, depth: int) -> dict:
    """Loss against steps, model against GD predictions, loss out of range; bare Figures, drawn without a backend."""
    from matplotlib.figure import Figure

    curve = report["loss_vs_steps"]
    fig_k = Figure(figsize=(5, 3.4))
    ax = fig_k.subplots()
    ax.plot(curve["steps"], curve["gd"], "o-", label="GD")
    ax.plot(curve["steps"], curve["gdpp"], "s-", label="GD++ (shared)")
    if f"gdpp_layers_{depth}" in report["learners"]:
        ax.plot([depth], [report["learners"][f"gdpp_layers_{depth}"]["loss"]], "D", label="GD++ (per layer)")
    ax.plot([depth], [report["model_loss"]], "*", ms=16, color="k", mfc="none", zorder=3,  # hollow: learners show
            label=f"model ({depth} layer{'s' * (depth > 1)})")
    ax.axhline(report["zero_loss"], ls=":", color="gray", label="predict 0")
    ax.axhline(report["learners"]["least_squares"]["loss"], ls="--", color="gray", lw=0.8, label="least squares")
    ax.set(xlabel="steps K", ylabel="held-out loss (half MSE)", xticks=curve["steps"], ylim=(0, None),
           title="loss against steps")
    ax.legend(fontsize=7)
    fig_k.tight_layout()

    fig_s = Figure(figsize=(4, 4))
    ax = fig_s.subplots()
    ref = f"gd_{depth}"
    m, r = arrays["model"][:2000], arrays["learners"][ref][:2000]
    ax.scatter(r, m, s=3, alpha=0.4)
    lim = float(np.max(np.abs(np.concatenate([m, r]))))
    ax.plot([-lim, lim], [-lim, lim], "k--", lw=0.8)
    ax.set(xlabel=f"{depth}-step GD prediction", ylabel="model prediction", aspect="equal",
           title=f"predictions (cos {report['sensitivity_cosine']:.3f})")
    fig_s.tight_layout()

    o = report["ood"]
    fig_o = Figure(figsize=(5, 3.4))
    ax = fig_o.subplots()
    ax.plot(o["scale"], o["model_loss"], "*-", color="k", label="model")
    for key in o:
        if key.endswith("_loss") and key != "model_loss":
            ax.plot(o["scale"], o[key], "o--", label=_label(key[:-5]))
    ax.set(xlabel="input scale (x training range)", ylabel="loss", yscale="log", title="out of distribution")
    ax.legend(fontsize=7)
    fig_o.tight_layout()
    return {"gd_match_loss_vs_steps": fig_k, "gd_match_predictions": fig_s, "gd_match_ood": fig_o}


def _label(name: str) -> str:
    kind, _, steps = name.rpartition("_")
    learner = {"gd": "GD", "gdpp": "GD++", "gdpp_layers": "GD++ per layer"}[kind]
    return f"{learner}, {steps} step{'s' * (steps != '1')} (fitted in range)"


def run(inp: ProbeInput):
    report, arrays = gd_match(inp.model, inp.cfg, inp.key, inp.options)
    return report, figures(report, arrays, inp.cfg.model.depth)


probe = Probe(
    run=run,
    applies=lambda cfg: None if cfg.task.name == "linreg" else f"needs an in-context regression run (task=linreg), "
                                                               f"not {cfg.task.name!r}",
    description="the model against K-step GD, GD++ and least squares on the same prompts",
)
