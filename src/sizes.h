/* Internal: the size rules of every entry point, written once. A count or extent that breaks
 * them is SDPA_ERR_SIZE before anything is read; no product is formed before it is known to
 * fit. */
#ifndef SDPA_SRC_SIZES_H
#define SDPA_SRC_SIZES_H

#include <stddef.h>
#include <stdint.h>

/* No object is larger than PTRDIFF_MAX bytes (the difference of two pointers into it must fit),
 * so no array holds more floats than this, whatever its pointer: a larger count or extent is a
 * size error, not a read. It also keeps every index and every p + n of the kernels in range. */
#define SDPA_MAX_FLOATS ((size_t)PTRDIFF_MAX / sizeof(float))

/* a * b + c, or 0 with *ok cleared when that does not fit in size_t */
static inline size_t sdpa_mul_add(size_t a, size_t b, size_t c, int *ok) {
    if (b && a > (SIZE_MAX - c) / b) {
        *ok = 0;
        return 0;
    }
    return a * b + c;
}

/* n_rows rows of `row` floats, `stride` floats apart, span at most SDPA_MAX_FLOATS:
 * (n_rows - 1) * stride + row, checked without forming it */
static inline int sdpa_rows_fit(size_t n_rows, size_t row, size_t stride) {
    if (row > SDPA_MAX_FLOATS) return 0;
    return n_rows <= 1 || stride == 0 || n_rows - 1 <= (SDPA_MAX_FLOATS - row) / stride;
}

/* The same for a [d0][d1][d2][row] view (d0, d1, d2 >= 1) of elements of `size` bytes: one past
 * its last element, (d0 - 1) s0 + (d1 - 1) s1 + (d2 - 1) s2 + row, is at most PTRDIFF_MAX bytes */
static inline int sdpa_view_fits_sized(const size_t stride[3], size_t d0, size_t d1, size_t d2,
                                       size_t row, size_t size) {
    int ok = 1;
    size_t end = sdpa_mul_add(d0 - 1, stride[0], row, &ok);
    end = sdpa_mul_add(d1 - 1, stride[1], end, &ok);
    end = sdpa_mul_add(d2 - 1, stride[2], end, &ok);
    return ok && end <= (size_t)PTRDIFF_MAX / size;
}

/* a view of floats */
static inline int sdpa_view_fits(const size_t stride[3], size_t d0, size_t d1, size_t d2,
                                 size_t row) {
    return sdpa_view_fits_sized(stride, d0, d1, d2, row, sizeof(float));
}

/* [a, a + a_bytes) and [b, b + b_bytes) share a byte */
static inline int sdpa_bytes_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + b_bytes && y < x + a_bytes;
}

#endif
