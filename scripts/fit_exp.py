#!/usr/bin/env python3
"""Fits the polynomials of sdpa's "fast" exp and prints the constants of arch/kernels.h.

    scripts/fit_exp.py [--free-c1] [TABLE_BITS DEGREE]...   (default: 4 3, then 3 3)

e^x = 2^(N / 2^b) * e^r with N = round(x * 2^b / ln 2) and |r| <= ln2 / 2^(b+1); the table holds
2^(j / 2^b) for j < 2^b and p(r) = 1 + r + c2 r^2 + ... + cd r^d approximates e^r. The
coefficients c2..cd minimise the largest relative error |p(r) e^-r - 1| on that interval (Remez
exchange on the d - 1 free coefficients, in double); the error printed is that of the
coefficients after rounding to float, measured on a dense grid. With --free-c1 the slope c1 is
fitted too, p(r) = 1 + c1 r + ...: a smaller error, for the kernels whose exps only matter up to
a common factor (avx512 softmax_short's 32-entry exp). Python's standard library only.
"""
import math
import struct
import sys


def to_float(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def hexf(v):
    """C hex-float literal of a float value"""
    if v == 0:
        return "0x0p+0f"
    m, e = math.frexp(abs(v))  # v = m 2^e, m in [0.5, 1)
    bits = int(round(m * 2**24))  # 24 significant bits
    mant, exp = bits, e - 24
    while mant % 2 == 0:
        mant //= 2
        exp += 1
    # normalise to 0x1.xxxp+e
    shift = mant.bit_length() - 1
    frac = mant - (1 << shift)
    digits = (shift + 3) // 4
    frac <<= digits * 4 - shift
    text = f"0x1.{frac:0{digits}x}p{exp + shift:+d}f" if digits else f"0x1p{exp + shift:+d}f"
    return ("-" if v < 0 else "") + text


def solve(a, b):
    """Gaussian elimination with partial pivoting: a x = b"""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def rel_err(coeffs, r, first=2):
    p = 0.0
    for c in reversed(coeffs):  # coeffs = [c_first, ..., cd]
        p = p * r + c
    p = 1.0 + r**first * p + (r if first == 2 else 0.0)
    return p * math.exp(-r) - 1.0


def remez(half_width, degree, first=2, rounds=30):
    free = degree - first + 1  # c_first..cd
    n_points = free + 1
    # Chebyshev nodes as the first reference
    xs = [half_width * math.cos(math.pi * (n_points - 1 - i) / (n_points - 1)) for i in range(n_points)]
    coeffs = [1.0 / math.factorial(k) for k in range(first, degree + 1)]
    for _ in range(rounds):
        # p(x_i) - e^x_i = (-1)^i E e^x_i  ->  sum_k c_k x^k - (-1)^i E e^x = e^x - 1 (- x)
        rows, rhs = [], []
        for i, x in enumerate(xs):
            rows.append([x**k for k in range(first, degree + 1)] + [-((-1) ** i) * math.exp(x)])
            rhs.append(math.exp(x) - 1.0 - (x if first == 2 else 0.0))
        sol = solve(rows, rhs)
        coeffs = sol[:free]
        # new reference: the extrema of the error between sign changes
        grid = [-half_width + 2 * half_width * i / 20000 for i in range(20001)]
        errs = [rel_err(coeffs, x, first) for x in grid]
        segments, start = [], 0
        for i in range(1, len(grid)):
            if (errs[i] > 0) != (errs[start] > 0):
                segments.append((start, i))
                start = i
        segments.append((start, len(grid)))
        ext = [max(range(s, e), key=lambda i: abs(errs[i])) for s, e in segments]
        if len(ext) >= n_points:
            ext = sorted(ext, key=lambda i: -abs(errs[i]))[:n_points]
            xs = sorted(grid[i] for i in ext)
    return coeffs


def main(args):
    first = 2
    if args[:1] == ["--free-c1"]:
        first, args = 1, args[1:]
    pairs = [(int(args[i]), int(args[i + 1])) for i in range(0, len(args), 2)] or [(4, 3), (3, 3)]
    ln2 = math.log(2.0)
    for bits, degree in pairs:
        size = 1 << bits
        half_width = ln2 / 2 ** (bits + 1)
        coeffs = [to_float(c) for c in remez(half_width, degree, first)]
        worst = max(abs(rel_err(coeffs, -half_width + 2 * half_width * i / 200000, first))
                    for i in range(200001))
        print(f"/* {size}-entry table, degree {degree}, |r| <= ln2/{2 ** (bits + 1)}: "
              f"max relative error {worst:.3g} ({worst / 2**-24:.3f} ULP of 2^-24) */")
        for k, c in enumerate(coeffs, start=first):
            print(f"#define C{k} {hexf(c)}")
        step = ln2 / size
        hi = to_float(step)
        print(f"#define LN2_HI {hexf(hi)}  /* ln2 / {size}, rounded */")
        print(f"#define LN2_LO {hexf(to_float(step - hi))}  /* what the rounding left out */")
        print(f"#define SCALE {hexf(to_float(size / ln2))}  /* {size} / ln2 */")
        print("table 2^(j/%d):" % size, ", ".join(hexf(to_float(2.0 ** (j / size))) for j in range(size)))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
