#!/usr/bin/env python3
"""Fits the polynomial of src/common/exp2_poly.h: 2^f ~ 1 + f (c1 + f (c2 + f c3)) on f in
[-1/2, 1/2], minimising the largest relative error (minimax), with p(0) = 1 exactly.

The fit is a linear programme over a dense grid (the relative error is linear in c1..c3):
minimise t subject to |p(f_k) / 2^f_k - 1| <= t. The coefficients are then rounded to float32
and the error is measured again in float32 arithmetic, as the kernel evaluates it (the rounding
of f = x - round(x) is exact; each Horner step is one fused multiply-add, rounded once).

    python3 scripts/fit_exp2_poly.py [degree]
"""
import sys

import numpy as np
from scipy.optimize import linprog


def fit(degree, grid=20001):
    f = np.linspace(-0.5, 0.5, grid)
    target = np.exp2(f)
    # p(f) / 2^f - 1 = sum_k c_k f^k / 2^f + (1 / 2^f - 1): unknowns c_1..c_degree and t.
    a = np.stack([f**k / target for k in range(1, degree + 1)], axis=1)
    b = 1.0 - 1.0 / target
    ones = np.ones((grid, 1))
    a_ub = np.vstack([np.hstack([a, -ones]), np.hstack([-a, -ones])])
    b_ub = np.concatenate([b, -b])
    cost = np.zeros(degree + 1)
    cost[-1] = 1.0
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(None, None)] * (degree + 1), method="highs")
    assert res.success, res.message
    return res.x[:degree], res.x[degree]


def horner_f32(coeffs, f):
    """1 + f (c1 + f (c2 + ...)) in float32, each step one fused multiply-add."""
    c = [np.float32(v) for v in coeffs]
    p = np.full_like(f, c[-1], dtype=np.float32)
    for ck in reversed(c[:-1]):
        p = (p.astype(np.float64) * f + np.float64(ck)).astype(np.float32)  # a*b exact in f64
    return (p.astype(np.float64) * f + 1.0).astype(np.float32)


def main():
    degree = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    coeffs, t = fit(degree)
    print(f"degree {degree}: minimax relative error over the grid {t:.3e}")
    for k, c in enumerate(coeffs, start=1):
        print(f"  c{k} = {np.float32(c).item():.9e}f  (float32 bits {np.float32(c).view(np.uint32):#010x})")
    f = np.linspace(-0.5, 0.5, 2_000_001).astype(np.float32)
    rel = np.abs(horner_f32(coeffs, f).astype(np.float64) / np.exp2(f.astype(np.float64)) - 1.0)
    print(f"  float32 evaluation: max relative error {rel.max():.3e}")


if __name__ == "__main__":
    main()
