/* The OCP 8-bit floats (fp8.h): exact widening and round-to-nearest-even narrowing on the bit
 * patterns. */
#include "fp8.h"

#include <pthread.h>
#include <string.h>

/* A format: mantissa bits, exponent bias, the largest finite code (sign aside). */
typedef struct fp8_format {
    int m, bias;
    uint32_t max_code;
    int has_inf;
} fp8_format;

static fp8_format format_of(uint32_t type) {
    const fp8_format e4m3 = {3, 7, 0x7e, 0}, e5m2 = {2, 15, 0x7b, 1};
    return type == 3 ? e4m3 : e5m2;
}

static uint32_t float_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

static float bits_float(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}

/* The float bits of code c (sign aside): every fp8 value is a normal float or zero. */
static uint32_t widen_bits(uint32_t c, const fp8_format *f) {
    const uint32_t e = c >> f->m, mant = c & ((1u << f->m) - 1);
    const uint32_t e_all = (1u << (7 - f->m)) - 1; /* the all-ones exponent */
    if (e == e_all && (f->has_inf || mant == (1u << f->m) - 1))
        return f->has_inf && mant == 0 ? 0x7f800000u : 0x7fc00000u;
    if (e == 0) { /* subnormal: mant 2^(1 - bias - m), normalised */
        if (mant == 0) return 0;
        int shift = 0;
        while (!(mant << shift & (1u << f->m))) shift++;
        const uint32_t exp32 = (uint32_t)(1 - f->bias - shift + 127);
        return exp32 << 23 | ((mant << shift) & ((1u << f->m) - 1)) << (23 - f->m);
    }
    return (e - (uint32_t)f->bias + 127) << 23 | mant << (23 - f->m);
}

/* m >> shift rounded to nearest, ties to even (shift 1..31) */
static uint32_t round_shift(uint32_t m, int shift) {
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    return q + (rem > half || (rem == half && (q & 1)));
}

/* The code (sign aside) of |x|'s float bits a, not NaN: rounded, then saturated or infinite. */
static uint32_t narrow_code(uint32_t a, const fp8_format *f) {
    const uint32_t overflow = f->has_inf ? 0x7cu : f->max_code;
    if (a >= 0x7f800000u) return overflow;          /* inf */
    const int e = (int)(a >> 23) - 127;             /* a float subnormal rounds to 0 below */
    const uint32_t m = (a & 0x7fffffu) | 0x800000u; /* 24 bits, value m 2^(e - 23) */
    const int e_min = 1 - f->bias;
    uint32_t code;
    if (e < e_min) { /* the subnormal quantum 2^(e_min - m_bits): code = value / quantum */
        const int shift = 23 - f->m + (e_min - e);
        code = shift > 25 ? 0 : round_shift(m, shift);
    } else {
        uint32_t q = round_shift(m, 23 - f->m); /* in [2^m, 2^(m + 1)] */
        int ee = e;
        if (q >> (f->m + 1)) q >>= 1, ee++;
        const long biased = (long)ee + f->bias;
        if (biased > (long)(f->max_code >> f->m)) return overflow;
        code = (uint32_t)biased << f->m | (q & ((1u << f->m) - 1));
    }
    return code > f->max_code ? overflow : code;
}

/* Every code's float, a table a type, made once: a load an element; and the same at the scale
   of the kernels' widen_fp8 (e4m3 at 2^-8, exactly: the smallest, 2^-17, is a normal float). */
static float widen_table[2][256], kernel_table[2][256];
static pthread_once_t widen_once = PTHREAD_ONCE_INIT;

static void widen_tables(void) {
    for (uint32_t t = 0; t < 2; t++) {
        const fp8_format f = format_of(3 + t);
        for (uint32_t c = 0; c < 256; c++) {
            widen_table[t][c] = bits_float((c & 0x80) << 24 | widen_bits(c & 0x7fu, &f));
            kernel_table[t][c] = widen_table[t][c] * (t == 0 ? 0x1p-8f : 1.0f);
        }
    }
}

const float *sdpa_fp8_kernel_floats(uint32_t type) {
    pthread_once(&widen_once, widen_tables);
    return kernel_table[type - 3];
}

void sdpa_fp8_widen(float *dst, const uint8_t *src, size_t n, uint32_t type) {
    pthread_once(&widen_once, widen_tables);
    const float *table = widen_table[type - 3];
    for (size_t i = 0; i < n; i++) dst[i] = table[src[i]];
}

void sdpa_fp8_narrow(uint8_t *dst, const float *src, size_t n, uint32_t type) {
    const fp8_format f = format_of(type);
    const uint8_t nan = type == 3 ? 0x7f : 0x7e;
    for (size_t i = 0; i < n; i++) {
        const uint32_t b = float_bits(src[i]), a = b & 0x7fffffffu;
        const uint8_t sign = (uint8_t)(b >> 24 & 0x80);
        dst[i] = (uint8_t)(sign | (a > 0x7f800000u ? nan : narrow_code(a, &f)));
    }
}
