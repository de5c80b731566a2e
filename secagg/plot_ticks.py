"""Tick labels a reader can read, for the plots (:mod:`secagg.plots`) and the report's
figures: fixed ticks with labels written here (never matplotlib's offset or scientific
formatters), distinct by construction, on a log axis when the data span decades, and
thinned after layout (:func:`_fit_ticks`) until no two labels of an axis overlap."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

# -- ticks a reader can read ------------------------------------------------------------
#
# Every axis gets fixed ticks with labels written here (no offset text, no exponent
# shared by the axis), chosen so that the labels are distinct by construction: a linear
# axis puts its ticks on multiples of one step and prints as many decimals as the step
# has, so two ticks never print alike, whatever the range (1.570e5..1.575e5 reads 157000,
# 157100, ...; 157000..157000.4 reads 157000.0, 157000.1, ...). A positive range
# spanning LOG_DECADES decades or more goes on a log axis with 1-2-5 or decade ticks.
# :func:`_fit_ticks` then measures the rendered labels and steps down to sparser ticks
# until no two labels of an axis overlap; ticks given explicitly (the swept epsilons)
# keep their marks and lose the labels that would overlap.

#: A positive data range this many decades wide (max/min >= 10**LOG_DECADES) gets a log axis.
LOG_DECADES = 1.5
#: An epsilon axis goes logarithmic from one decade up: a grid of epsilons (1, 4, 16) is
#: read by ratios, and a linear axis crushes its private end.
EPSILON_LOG_DECADES = 1.0
_PREFIXES = ((1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T"))
_GAP_PX = 3.0  # the least gap between two tick labels, in pixels


def _decimals(step: float) -> int:
    """How many decimals print ``step`` (and so every multiple of it) exactly."""
    for d in range(13):
        scaled = abs(step) * 10 ** d
        if abs(scaled - round(scaled)) <= 1e-6 * max(scaled, 1e-300):
            return d
    return 12


def _linear_labels(ticks: Sequence[float]) -> list[str]:
    """Labels of evenly spaced ticks: one unit prefix (none, k, M, G, T) for the axis and
    the decimals of the step, whichever prefix gives the shortest labels. Distinct for
    distinct ticks (each is a multiple of the step, printed exactly)."""
    if len(ticks) == 1:
        return [_value_label(ticks[0])]
    step = min(abs(b - a) for a, b in zip(ticks, ticks[1:], strict=False))
    best: list[str] | None = None
    for scale, suffix in _PREFIXES:
        if scale > 1 and max(abs(t) for t in ticks) < scale:
            break
        d = _decimals(step / scale)
        labels = ["0" if abs(t) < step * 1e-9 else
                  f"{t / scale:.{d}f}".replace("-", "\u2212") + suffix for t in ticks]
        if best is None or max(map(len, labels)) < max(map(len, best)):
            best = labels
    if best is None or len(set(best)) < len(set(ticks)):  # a step below 1e-12: no prefix
        return _value_labels(ticks)
    if max(map(len, best)) > 8:  # e.g. 0.000000003: each value on its own (3e-09) when
        for digits in range(1, 8):  # that is shorter and still exact
            alone = [f"{t:.{digits}g}" for t in ticks]
            if all(math.isclose(float(a), t, rel_tol=1e-9, abs_tol=step * 1e-9)
                   for a, t in zip(alone, ticks, strict=True)):
                if max(map(len, alone)) < max(map(len, best)):
                    return [a.replace("-", "\u2212") for a in alone]
                break
    return best


def _value_label(v: float, digits: int = 4) -> str:
    """A short label for one value (``digits`` significant digits at most): 200, 2k, 5M,
    0.01, -7.5."""
    for scale, suffix in reversed(_PREFIXES):
        if scale > 1 and abs(v) >= scale:
            return f"{v / scale:.{digits}g}".replace("-", "\u2212") + suffix
    return f"{v:.{digits}g}".replace("-", "\u2212")


def _value_labels(ticks: Sequence[float]) -> list[str]:
    """Labels of arbitrary ticks (the swept epsilons, log ticks), with as few significant
    digits as keep distinct ticks distinct (4 at least)."""
    labels: list[str] = []
    for digits in range(4, 18):
        labels = [_value_label(t, digits) for t in ticks]
        if len(set(labels)) == len(set(ticks)):
            break
    return labels


def _linear_candidates(lo: float, hi: float, integer: bool = False) -> list[list[float]]:
    """Tick sets inside [lo, hi], densest first (each of evenly spaced nice numbers;
    whole numbers only when ``integer``)."""
    from matplotlib.ticker import MaxNLocator

    out: list[list[float]] = []
    span = hi - lo
    for n in (6, 5, 4, 3, 2, 1):  # steps 1-2-5 (not 2.5: one decimal more on every label)
        ticks = [float(t) for t in MaxNLocator(nbins=n, steps=[1, 2, 5, 10], integer=integer)
                 .tick_values(lo, hi) if lo - 1e-9 * span <= t <= hi + 1e-9 * span]
        if len(ticks) >= 2 and ticks not in out:
            out.append(ticks)
    return out or [[(lo + hi) / 2]]


def _log_candidates(lo: float, hi: float) -> list[list[float]]:
    """Tick sets inside [lo, hi] (0 < lo < hi) on a log axis, densest first: 1-2-5 per
    decade, 1-3, then every decade, every second decade, ..."""
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    out: list[list[float]] = []
    for subs in ((1.0, 2.0, 5.0), (1.0, 3.0)):
        ticks = [m * 10.0 ** k for k in range(k0, k1 + 1) for m in subs
                 if lo <= m * 10.0 ** k <= hi]
        if len(ticks) >= 2:
            out.append(ticks)
    decades = [10.0 ** k for k in range(k0, k1 + 1) if lo <= 10.0 ** k <= hi]
    for stride in range(1, max(len(decades), 1) + 1):
        ticks = [t for i, t in enumerate(decades) if i % stride == 0]
        if len(ticks) >= 2 and ticks not in out:
            out.append(ticks)
    if not out:  # less than one decade inside the view: its two ends
        out.append([lo, hi])
    return out


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _is_wide(values: Sequence[float], decades: float = LOG_DECADES) -> bool:
    """Whether ``values`` go on a log axis: all positive and spanning ``decades`` decades
    (LOG_DECADES; EPSILON_LOG_DECADES for epsilons)."""
    return (bool(values) and min(values) > 0
            and math.log10(max(values) / min(values)) >= decades - 1e-12)


class _AxisTicks:
    """The tick plan of one axis: candidate tick sets (densest first) with their labels,
    or fixed ticks whose labels may be thinned."""

    def __init__(self, axis: Any, values: Sequence[float], fixed: Sequence[float] = (),
                 log: bool | None = None, integer: bool = False) -> None:
        from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

        self.axis = axis
        vals = _finite(values) + _finite(fixed)
        self.log = _is_wide(vals) if log is None else log
        ax = axis.axes
        if self.log:
            (ax.set_xscale if axis is ax.xaxis else ax.set_yscale)("log")
        ax.autoscale_view()
        lo, hi = sorted(axis.get_view_interval())
        self.limits = (lo, hi)
        self.fixed = bool(fixed)
        if fixed:
            ticks = sorted(set(_finite(fixed)))
            self.candidates = [[t for t in ticks if lo <= t <= hi] or ticks]
            self.labels = [_value_labels(self.candidates[0])]
        else:
            distinct = sorted(set(vals))
            if len(distinct) == 1:
                self.candidates = [distinct]
            elif self.log:
                self.candidates = _log_candidates(lo, hi)
            else:
                self.candidates = _linear_candidates(lo, hi, integer)
            self.labels = [_value_labels(c) if self.log or len(c) == 1
                           else _linear_labels(c) for c in self.candidates]
        self.level = 0
        axis.set_minor_locator(NullLocator())
        axis.set_minor_formatter(NullFormatter())
        axis.set_major_locator(FixedLocator(self.candidates[0]))
        self.apply()

    def apply(self) -> None:
        """Set the ticks and labels of the current level; keep the view limits."""
        ax = self.axis.axes
        self.axis.set_ticks(self.candidates[self.level], self.labels[self.level])
        (ax.set_xlim if self.axis is ax.xaxis else ax.set_ylim)(*self.limits)

    def thin(self, renderer: Any) -> None:
        """Blank the labels that would come too close to the last one kept, left to right
        (bottom to top); the tick marks stay."""
        horizontal = self.axis is self.axis.axes.xaxis
        ticks, labels = self.candidates[self.level], self.labels[self.level]
        boxes = []
        for tick in self.axis.get_major_ticks():
            lab = tick.label1
            if lab.get_visible() and lab.get_text() and tick.get_loc() in ticks:
                box = lab.get_window_extent(renderer)
                boxes.append(((box.x0, box.x1) if horizontal else (box.y0, box.y1),
                              ticks.index(tick.get_loc())))
        last = -math.inf
        for (lo, hi), i in sorted(boxes):
            if lo < last + _GAP_PX:
                labels[i] = ""
            else:
                last = hi
        self.apply()

    def sparser(self) -> bool:
        """Step to the next sparser tick set; False when there is none."""
        if self.level + 1 >= len(self.candidates):
            return False
        self.level += 1
        self.apply()
        return True


def _labels_of(axis: Any) -> list[Any]:
    return [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]


def _overlapping(axis: Any, renderer: Any) -> bool:
    """Whether two visible tick labels of ``axis`` overlap (or come closer than _GAP_PX)."""
    horizontal = axis is axis.axes.xaxis
    boxes = sorted((t.get_window_extent(renderer) for t in _labels_of(axis)),
                   key=lambda b: b.x0 if horizontal else b.y0)
    if horizontal:
        return any(a.x1 + _GAP_PX > b.x0 for a, b in zip(boxes, boxes[1:], strict=False))
    return any(a.y1 + _GAP_PX > b.y0 for a, b in zip(boxes, boxes[1:], strict=False))


def _fit_ticks(fig: Any, plans: Sequence[_AxisTicks]) -> None:
    """Step each axis down to sparser ticks until no two of its labels overlap, as laid
    out (the layout moves as labels change, so this measures again after each change);
    fixed ticks, and any axis still crowded at its sparsest, lose overlapping labels."""
    for _ in range(12):
        _, crowded = _crowded(fig, plans)
        if not crowded:
            return
        stepped = [p.sparser() for p in crowded if not p.fixed]  # every one, no short cut
        if not any(stepped):
            break
    for _ in range(3):
        renderer, crowded = _crowded(fig, plans)
        if not crowded:
            return
        for p in crowded:
            p.thin(renderer)


def _crowded(fig: Any, plans: Sequence[_AxisTicks]) -> tuple[Any, list[_AxisTicks]]:
    """Lay the figure out; its renderer and the axes whose tick labels overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return renderer, [p for p in plans if _overlapping(p.axis, renderer)]
