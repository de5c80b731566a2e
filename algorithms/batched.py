"""Batched local training: the clients of a chunk train together in one vectorised call.

:func:`train_batched` runs what :func:`algorithms.training.train_local` runs for each client
of a chunk, all at once: the clients' parameters and optimizer states are stacked along a
leading client axis, and every step computes all their gradients in one call of
``torch.func.vmap`` over ``torch.func.grad`` of ``torch.func.functional_call`` (a model made
only of ``Linear``, ``ReLU``, ``Flatten`` and the feature clamp, such as FedAvg's MLP, takes
the same step as batched matrix products under plain autograd, which is cheaper on CPU). It
reproduces the loop client by client:

* **Batch order.** Each client's batches are drawn exactly as ``train_local`` draws them:
  a ``torch.Generator`` seeded with the client's ``seed`` (masked to 63 bits), one
  ``torch.randperm`` per epoch, batches cut in that order, the last one of an epoch short.
* **Unequal data sizes (masked steps).** Client *i* takes ``S_i = epochs * ceil(n_i / B)``
  steps. The chunk's clients are ordered by ``S_i`` (longest first), so at global step *j*
  the clients that still have a batch form a prefix of the stack; only that prefix is
  computed and updated, and a client whose data is exhausted keeps its parameters and its
  optimizer state unchanged from then on. A short batch is padded to ``B`` rows of weight 0;
  its loss is the weighted mean over the real rows, so its gradient is the loop's mean-loss
  gradient (padded rows contribute exact zeros).
* **Optimizers.** SGD (``lr``), SGD with momentum (``momentum``, dampening 0, no Nesterov:
  ``buf = m * buf + g``; ``p -= lr * buf``, the first step ``buf = g``) and Adam (PyTorch's
  defaults: betas (0.9, 0.999), eps 1e-8, bias correction with the client's own step count),
  written out as ``torch.optim.SGD``/``torch.optim.Adam`` compute them.
  ``fresh_optimizer_each_epoch`` zeroes a client's state at the start of each of its epochs.

The results agree with the loop up to float32 rounding (vectorised kernels sum in another
order); ``tests/test_batched.py`` checks 1e-5 on every parameter. Adam amplifies rounding
in coordinates whose gradient is a near-cancelling sum (it divides by the gradient's own
scale): on a CNN at lr 0.01 to 0.05 single clients drifted 1e-4 to 1e-2 from the loop,
exactly as far as the loop itself drifts when its convolution is computed another way
(im2col), so the tests hold Adam on the CNN to lr 1e-3.

Where it pays (measured on a shared 2-core CPU, process CPU time): FedAvg's MLP on the
digits, 20 clients, 2 rounds of 2 local epochs, 3.3 s batched against 12.4 s in the loop;
the Fashion-MNIST CNN through the CLI (``secagg run --algorithm fedavg --dataset
fashion-mnist --clients 1000 --rounds 2 --local-epochs 1``, torch's default threads),
back to back on a quiet machine (load about 2.7): client CPU 51.9 s batched in chunks of
16 against 56.3 s in the loop, wall 44.6 s against 52.2 s, peak RSS 1.5 GB against 2.3 GB,
same accuracy; on a loaded one (load 7 to 15) 129.9 s against 310.3 s of client CPU (wall
196 s against 460 s). In one process with one torch
thread the same CNN training was slower batched (256 clients: 4.7 s against 2.9 s): a
vmapped convolution over stacked weights runs as a grouped convolution, whose backward
pass is slow on CPU; the gain above is modest, and larger where threads contend.
:class:`algorithms.fedavg.FedAvg` therefore batches by default only models without
convolutions (``batched=True`` forces it for a CNN).

Where batching does not apply, the per-client loop (``train_local``) stays the reference and
the fallback, and :func:`batching_unsupported` names the reason:

* record-level DP-SGD (Opacus): per-sample clipping, noise and Poisson-sampled batches are
  Opacus's own machinery around one model and one optimizer;
* a model with buffers, batch norm or dropout (state or randomness per forward pass that a
  stacked functional call would not reproduce as the loop does);
* a loss other than the plain cross-entropy (a custom ``loss_fn`` closes over one
  ``nn.Module``, so it cannot be evaluated functionally on stacked parameters), or training
  only some of the parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = ["BatchedResult", "batching_unsupported", "train_batched"]

_STATEFUL = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd,
             nn.AlphaDropout, nn.FeatureAlphaDropout)


def batching_unsupported(model: nn.Module, *, dpsgd: object | None = None,
                         optimizer: str = "sgd") -> str | None:
    """Why ``model`` cannot be trained by :func:`train_batched` (None when it can).

    Refused: record-level DP-SGD (Opacus trains one model at a time), a model with buffers,
    batch norm or dropout, and an optimizer other than ``"sgd"`` or ``"adam"``.
    """
    if dpsgd is not None:
        return ("record-level DP-SGD runs through Opacus (per-sample clipping, noise, "
                "Poisson-sampled batches) one model at a time; the per-client loop trains it")
    if optimizer not in ("sgd", "adam"):
        return f"optimizer must be 'sgd' or 'adam', got {optimizer!r}"
    for name, mod in model.named_modules():
        if isinstance(mod, _STATEFUL):
            return (f"module {name or type(mod).__name__!r} ({type(mod).__name__}) keeps "
                    "running statistics or draws randomness per forward pass; the "
                    "per-client loop trains it")
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:
        return f"the model has buffers ({', '.join(buffers[:3])}); the per-client loop trains it"
    return None


def _stacked_plan(model: nn.Module) -> list[tuple] | None:
    """The forward pass of a model made only of ``Linear``, ``ReLU``, ``Flatten`` (its
    defaults) and the models' feature clamp, in :class:`~algorithms.models.SplitModel`s and
    ``Sequential``s, as a list of steps over parameter names; None for any other model
    (it then goes through ``vmap``). On stacked parameters such a model's step is a few
    batched matrix products with plain autograd, cheaper on CPU than the same step through
    ``vmap`` and ``functional_call`` (measured in ``benchmarks/results/flower_simulation.txt``)."""
    from algorithms.models import SplitModel, _Clamp

    plan: list[tuple] = []

    def walk(mod: nn.Module, prefix: str) -> bool:
        if isinstance(mod, SplitModel):
            return walk(mod.body, f"{prefix}body.") and walk(mod.head, f"{prefix}head.")
        if type(mod) is nn.Sequential:
            return all(walk(child, f"{prefix}{name}.") for name, child in mod.named_children())
        if type(mod) is nn.Linear:
            plan.append(("linear", f"{prefix}weight",
                         f"{prefix}bias" if mod.bias is not None else None))
            return True
        if type(mod) is nn.ReLU:
            plan.append(("relu",))
            return True
        if type(mod) is _Clamp:
            plan.append(("clamp", mod.bound))
            return True
        if type(mod) is nn.Flatten and mod.start_dim == 1 and mod.end_dim == -1:
            plan.append(("flatten",))
            return True
        return False

    if not walk(model, "") or type(model) not in (SplitModel, nn.Sequential):
        return None
    return plan


def _stacked_grad(plan: list[tuple], names: list[str]):
    """``step_grad(p, xb, yb, wb)`` of :func:`train_batched` for a :func:`_stacked_plan`:
    each client's gradient of its weighted mean cross-entropy (clients' parameters are
    disjoint, so the gradient of the sum over clients is each client's own)."""

    def step_grad(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
                  wb: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        q = {n: p[n].detach().requires_grad_(True) for n in names}
        a, b = xb.shape[0], xb.shape[1]
        h = xb
        for op in plan:
            if op[0] == "linear":
                # W h^T with the weight as the left operand, so that its gradient comes out
                # in the weight's own (contiguous) layout: the optimizer's in-place updates
                # then read it in order, not through a transposed view
                ht = h.transpose(1, 2)
                out = (torch.bmm(q[op[1]], ht) if op[2] is None
                       else torch.baddbmm(q[op[2]].unsqueeze(2), q[op[1]], ht))
                h = out.transpose(1, 2)
            elif op[0] == "relu":
                h = torch.relu(h)
            elif op[0] == "clamp":
                h = torch.clamp(h, -op[1], op[1])
            else:  # flatten each record
                h = h.reshape(a, b, -1)
        per = nn.functional.cross_entropy(h.reshape(a * b, -1), yb.reshape(-1),
                                          reduction="none").reshape(a, b)
        mean = (per * wb).sum(1) / wb.sum(1)
        grads = torch.autograd.grad(mean.sum(), [q[n] for n in names])
        return dict(zip(names, grads, strict=True)), mean.detach()

    return step_grad


@dataclass
class BatchedResult:
    """The chunk's trained parameters, in the order of the inputs.

    ``params`` maps each parameter name (``model.named_parameters()`` order) to a tensor
    whose first axis is the client; ``losses`` is each client's mean loss over its last
    epoch (what ``train_local`` returns; 0.0 for a client without data).
    """

    params: dict[str, torch.Tensor]
    losses: np.ndarray

    def flat(self, i: int) -> np.ndarray:
        """Client ``i``'s parameters as one float32 vector, in the order of
        :func:`algorithms.models.get_flat` on the model's parameters."""
        return torch.cat([p[i].reshape(-1) for p in self.params.values()]).numpy().astype(
            np.float32)

    def flats(self) -> np.ndarray:
        """Every client's :meth:`flat` at once: a float32 matrix with one row per client
        (one concatenation for the chunk instead of one per client)."""
        ps = list(self.params.values())
        if not ps:
            return np.zeros((0, 0), dtype=np.float32)
        c = ps[0].shape[0]
        return torch.cat([p.reshape(c, -1) for p in ps], dim=1).numpy().astype(
            np.float32, copy=False)


def _schedule(n: int, seed: int, epochs: int, batch_size: int) -> list[torch.Tensor]:
    """The loop's batches for one client: index tensors, epoch after epoch."""
    gen = torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    out: list[torch.Tensor] = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        out.extend(order[i:i + batch_size] for i in range(0, n, batch_size))
    return out


def train_batched(
    model: nn.Module,
    data: Sequence[tuple[np.ndarray, np.ndarray]],
    seeds: Sequence[int],
    *,
    epochs: int = 1,
    batch_size: int = 32,
    lr: float = 0.05,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    fresh_optimizer_each_epoch: bool = False,
) -> BatchedResult:
    """Train one copy of ``model`` per client (all starting from ``model``'s parameters) on
    that client's ``(x, y)`` with the mean cross-entropy, as ``train_local(copy, x, y,
    seed=seeds[i], ...)`` would, in one vectorised pass; ``model`` is left unchanged.

    Raises ``ValueError`` when :func:`batching_unsupported` names a reason, or when
    ``data`` and ``seeds`` differ in length.
    """
    why = batching_unsupported(model, optimizer=optimizer)
    if why is not None:
        raise ValueError(f"train_batched: {why}")
    if len(data) != len(seeds):
        raise ValueError(f"train_batched: {len(data)} data sets but {len(seeds)} seeds")
    if epochs < 0 or batch_size < 1:
        raise ValueError("train_batched: epochs must be >= 0 and batch_size >= 1")
    from torch.func import functional_call, grad, vmap

    c = len(data)
    names = [n for n, _ in model.named_parameters()]
    base = {n: p.detach() for n, p in model.named_parameters()}
    params = {n: p.unsqueeze(0).repeat(c, *([1] * p.dim())).contiguous() for n, p in base.items()}
    sizes = [int(np.asarray(y).shape[0]) for _, y in data]
    losses = np.zeros(c, dtype=np.float64)
    if c == 0 or max(sizes, default=0) == 0 or epochs == 0:
        return BatchedResult(params, losses)

    # one array of every client's records; a client's batches index into it
    xs = [np.asarray(x, dtype=np.float32) for x, _ in data]
    xt = torch.from_numpy(np.concatenate(xs)) if sum(sizes) else None
    yt = torch.from_numpy(np.concatenate([np.asarray(y, dtype=np.int64) for _, y in data]))
    assert xt is not None
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    sched = [_schedule(n, s, epochs, batch_size) for n, s in zip(sizes, seeds, strict=True)]
    per_epoch = [math.ceil(n / batch_size) for n in sizes]
    # longest schedule first: the clients still training at step j are a prefix
    rank = sorted(range(c), key=lambda i: -len(sched[i]))
    steps = np.array([len(sched[i]) for i in rank])
    live = {n: params[n] for n in names}  # stacked in rank order (all equal so far)
    # SGD's momentum buffer is made at the first step (torch's buf = g, not m * 0 + g:
    # equal, and no zeroed stack to allocate and read); Adam's moments start at zero
    momentum_sgd = optimizer == "sgd" and bool(momentum)
    state: dict[str, dict[str, torch.Tensor]] = {
        k: {n: torch.zeros_like(p) for n, p in live.items()}
        for k in (("m", "v") if optimizer == "adam" else ())}
    count = torch.zeros(c, dtype=torch.float64)  # Adam's step count per client
    totals = np.zeros(c)
    seen = np.zeros(c)

    def loss(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
             wb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = functional_call(model, p, (xb,))
        per = nn.functional.cross_entropy(out, yb, reduction="none")
        mean = (per * wb).sum() / wb.sum()
        return mean, mean.detach()

    plan = _stacked_plan(model)
    step_grad = (vmap(grad(loss, has_aux=True), in_dims=(0, 0, 0, 0)) if plan is None
                 else _stacked_grad(plan, names))
    b1, b2, eps = 0.9, 0.999, 1e-8
    was_training = model.training
    model.train()  # as train_local (no module here acts differently in eval mode)
    for j in range(int(steps[0])):
        a = int(np.count_nonzero(steps > j))
        idx = torch.zeros((a, batch_size), dtype=torch.int64)
        w = torch.zeros((a, batch_size), dtype=torch.float32)
        for r in range(a):
            bi = sched[rank[r]][j]
            idx[r, :bi.numel()] = bi + int(offsets[rank[r]])
            w[r, :bi.numel()] = 1.0
        xb, yb = xt[idx], yt[idx]
        p_live = {n: live[n][:a] for n in names}
        g, lval = step_grad(p_live, xb, yb, w)
        starts = [j % per_epoch[rank[r]] == 0 for r in range(a)]
        if fresh_optimizer_each_epoch and any(starts):
            fresh = torch.tensor(starts)
            for st in state.values():
                for n in names:
                    st[n][:a][fresh] = 0.0
            count[:a][fresh] = 0.0
        with torch.no_grad():
            if optimizer == "adam":
                count[:a] += 1
                bc1 = 1 - b1 ** count[:a]
                bc2s = (1 - b2 ** count[:a]).sqrt()
                for n in names:
                    m, v = state["m"][n][:a], state["v"][n][:a]
                    m.lerp_(g[n], 1 - b1)
                    v.mul_(b2).addcmul_(g[n], g[n], value=1 - b2)
                    shape = (a,) + (1,) * (g[n].dim() - 1)
                    denom = (v.sqrt() / bc2s.to(v.dtype).view(shape)).add_(eps)
                    step = (lr / bc1).to(v.dtype).view(shape)
                    live[n][:a].sub_(step * m / denom)
            elif momentum_sgd and j == 0:
                # every client with data takes its first step now (a prefix of all): its
                # buffer is its gradient, as torch.optim.SGD's first step sets it
                state["buf"] = {n: g[n].contiguous() for n in names}
                for n in names:
                    live[n][:a].add_(g[n], alpha=-lr)
            elif momentum_sgd:
                for n in names:
                    # a zeroed state (fresh_optimizer_each_epoch): m * 0 + g = g exactly
                    buf = state["buf"][n][:a]
                    buf.mul_(momentum).add_(g[n])
                    live[n][:a].add_(buf, alpha=-lr)
            else:
                for n in names:
                    live[n][:a].add_(g[n], alpha=-lr)
        # the loss the loop reports: mean over the client's last epoch
        lv = lval.double().numpy()
        for r in range(a):
            i = rank[r]
            nb = sched[i][j].numel()
            if j % per_epoch[i] == 0:
                totals[i] = seen[i] = 0.0
            totals[i] += lv[r] * nb
            seen[i] += nb
    model.train(was_training)
    for i in range(c):
        losses[i] = totals[i] / max(1.0, seen[i])
    order = np.empty(c, dtype=np.int64)
    order[np.asarray(rank)] = np.arange(c)
    back = torch.from_numpy(order)
    return BatchedResult({n: live[n][back] for n in names}, losses)
