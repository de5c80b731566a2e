"""FedLog server solve: the exact float64 MAP versus the reference implementation's Adam loop.

Both methods maximise the same objective (paper Eq. 15),
``f(eta) = sum_y eta_y . S_y - N log sum_y exp(||eta_y||^2 / 4)``, on the same synthetic but
realistic aggregated statistics (multinomial class counts, per-class sums of non-negative
features clamped to [0, b]), at the paper's two head sizes: C = 10, D = d + 1 = 129 and
C = 100, D = 513.

The Adam loop is configured like the reference code (github.com/rossyu/fedlog,
``ExponentialFamilyConjugatePrior.maximize``): loss ``-f`` (not normalised by N), Adam with
lr 0.01 and torch's default betas (0.9, 0.999) and eps 1e-8, stop as soon as no entry of eta
moves by more than 1e-3 in one step, at most 10,000 steps. It starts from eta = 0 by default
(``--adam-init reference`` starts from the reference code's S / (2N)); ``--adam-backend
torch`` runs it through torch autograd and ``torch.optim.Adam`` like the reference.

The true optimum is the exact solve's eta with f evaluated in extended precision
(``np.longdouble``). Its own gap is certified by the local quadratic bound
``gap <= ||grad||^2 / (2 * mu)`` with ``mu = (N / 2) min_y w_y``, the smallest eigenvalue of
the first Hessian term of ``-f`` (the second term is positive semidefinite), which is
printed for the exact method; the Adam gap is ``f* - f(eta_adam)`` in extended precision.

Run: ``python benchmarks/fedlog_solver.py --repeats 5``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from algorithms.fedlog_solver import gradient, solve_map  # noqa: E402

CONFIGS = ((10, 128, 60000), (100, 512, 50000))  # (C, d, n): D = d + 1


def realistic_statistics(
    n_classes: int, dim: int, n: int, bound: float, seed: int
) -> tuple[np.ndarray, int]:
    """Summed statistics of one round: (C, dim + 1) with class counts in column 0, and n.

    Counts are multinomial over a Dirichlet(2) class distribution; each class has a mean
    feature vector in [0, bound]; the per-class sums carry sampling noise and are clipped to
    [0, count * bound], as sums of features clamped to [0, bound] must be.
    """
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, rng.dirichlet(np.full(n_classes, 2.0)))
    means = np.clip(rng.gamma(1.0, 0.4, size=(n_classes, dim)), 0.0, bound)
    noise = rng.standard_normal((n_classes, dim)) * np.sqrt(counts)[:, None] * 0.3
    sums = np.clip(counts[:, None] * means + noise, 0.0, counts[:, None] * bound)
    return np.column_stack([counts, sums]).astype(np.float64), n


def adam_reference(
    S: np.ndarray,
    N: float,
    eta0: np.ndarray,
    lr: float = 0.01,
    tol: float = 1e-3,
    max_iter: int = 10000,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> tuple[np.ndarray, int]:
    """Adam on -f from eta0, stopping when max |step| <= tol or after max_iter steps."""
    b1, b2 = betas
    eta = eta0.copy()
    m = np.zeros_like(eta)
    v = np.zeros_like(eta)
    g = np.empty_like(eta)
    step = np.empty_like(eta)
    half_n = 0.5 * N
    it = 0
    for it in range(1, max_iter + 1):
        q = 0.25 * np.einsum("ij,ij->i", eta, eta)
        w = np.exp(q - q.max())
        w *= half_n / w.sum()
        np.multiply(eta, w[:, None], out=g)  # gradient of the loss -f: N w eta / 2 - S
        g -= S
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * (g * g)
        c1 = 1.0 - b1**it
        c2 = 1.0 - b2**it
        np.sqrt(v / c2, out=step)
        step += eps
        np.divide(m, step, out=step)
        step *= lr / c1
        eta -= step
        if np.max(np.abs(step)) <= tol:
            break
    return eta, it


def adam_reference_torch(
    S: np.ndarray,
    N: float,
    eta0: np.ndarray,
    lr: float = 0.01,
    tol: float = 1e-3,
    max_iter: int = 10000,
) -> tuple[np.ndarray, int]:
    """The same Adam loop through torch autograd and torch.optim.Adam, as the reference code
    does it (float64 tensors here; the reference uses float32)."""
    import torch

    torch.set_num_threads(1)  # the numpy paths are single-threaded too
    s = torch.as_tensor(S, dtype=torch.float64)
    eta = torch.tensor(eta0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([eta], lr=lr)
    it = 0
    while it < max_iter:
        it += 1
        before = eta.detach().clone()
        opt.zero_grad()
        loss = -(eta * s).sum() + N * torch.logsumexp((eta * eta).sum(dim=1) / 4, dim=0)
        loss.backward()
        opt.step()
        if (eta.detach() - before).abs().max().item() <= tol:
            break
    return eta.detach().numpy().copy(), it


def objective_ld(eta: np.ndarray, S: np.ndarray, N: float) -> np.longdouble:
    """f(eta) in extended precision (np.longdouble), for gaps far below float64 rounding."""
    e = eta.astype(np.longdouble)
    s = S.astype(np.longdouble)
    q = np.sum(e * e, axis=1) / 4
    top = q.max()
    lse = top + np.log(np.sum(np.exp(q - top)))
    return np.sum(e * s) - np.longdouble(N) * lse


def timed(fn, repeats: int) -> tuple[float, object]:
    """Best wall time per call over ``repeats`` runs of >= 20 ms each, and the last result.

    The minimum (as in ``timeit``) is the least noisy estimate on a shared machine; it is
    applied to both methods alike.
    """
    times = []
    out = None
    for _ in range(repeats):
        inner = 0
        t0 = time.perf_counter()
        while True:
            out = fn()
            inner += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= 0.02:
                break
        times.append(elapsed / inner)
    return min(times), out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one table row per (configuration, method)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="timed repetitions (median)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic statistics")
    ap.add_argument("--nu", type=float, default=1.0, help="prior count nu (N = nu + n)")
    ap.add_argument("--bound", type=float, default=3.0, help="feature clamp b")
    ap.add_argument(
        "--adam-init",
        choices=("zero", "reference"),
        default="zero",
        help="Adam start: eta = 0, or the reference code's S / (2N)",
    )
    ap.add_argument(
        "--adam-backend",
        choices=("numpy", "torch"),
        default="numpy",
        help="Adam in hand-written numpy (fastest) or torch autograd + torch.optim.Adam",
    )
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    adam = adam_reference if args.adam_backend == "numpy" else adam_reference_torch
    header = (
        f"{'C':>4} {'D':>4} {'method':<7} {'time [s]':>10} {'iters':>6} "
        f"{'objective gap':>14} {'rel grad':>9} {'max|eta-eta*|':>13}"
    )
    print(
        f"FedLog server solve, N = n + {args.nu:g}, Adam init = {args.adam_init}, "
        f"Adam backend = {args.adam_backend}, best of {args.repeats}"
    )
    print(header)
    print("-" * len(header))
    ok = True
    for C, d, n in CONFIGS:
        S, n = realistic_statistics(C, d, n, args.bound, args.seed + C)
        N = n + args.nu
        s_norm = np.linalg.norm(S)

        t_exact, res = timed(lambda S=S, N=N: solve_map(S, N), args.repeats)
        eta_star = res.eta
        f_star = objective_ld(eta_star, S, N)
        mu = 0.5 * N * float(res.class_weights.min())
        gap_exact_bound = res.grad_norm**2 / (2.0 * mu)

        eta0 = np.zeros_like(S) if args.adam_init == "zero" else S / (2.0 * N)
        t_adam, (eta_adam, it_adam) = timed(
            lambda S=S, N=N, eta0=eta0: adam(S, N, eta0), args.repeats
        )
        gap_adam = float(f_star - objective_ld(eta_adam, S, N))
        g_adam = np.linalg.norm(gradient(eta_adam, S, N)) / s_norm

        print(
            f"{C:>4} {d + 1:>4} {'exact':<7} {t_exact:>10.2e} {res.iterations:>6} "
            f"{'<= ' + format(gap_exact_bound, '.1e'):>14} {res.grad_norm / s_norm:>9.1e} "
            f"{0.0:>13.1e}"
        )
        print(
            f"{C:>4} {d + 1:>4} {'adam':<7} {t_adam:>10.2e} {it_adam:>6} {gap_adam:>14.3e} "
            f"{g_adam:>9.1e} {np.max(np.abs(eta_adam - eta_star)):>13.3e}"
        )
        ratio = t_adam / t_exact
        smaller = gap_exact_bound < gap_adam
        ok &= ratio >= 100.0 and smaller
        print(
            f"{'':>4} {'':>4} ratio   adam/exact time = {ratio:,.0f}x; "
            f"|f*| = {abs(float(f_star)):.3e}; exact gap smaller: {smaller}"
        )
    print("target (>= 100x faster, smaller gap):", "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
