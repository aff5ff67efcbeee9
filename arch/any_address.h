/* Floats and 16-bit elements at any address. sdpa.h promises that pointers need no particular
 * alignment: a float * or uint16_t * made from a caller's void * view (sdpa_mha, sdpa_convert)
 * may sit at an odd byte address, where a plain dereference is undefined behaviour (and UBSan's
 * alignment check fails it). Through these types the compiler knows the alignment is 1; on
 * x86-64 and AArch64 the accesses compile to the same instructions. Vector loads and stores
 * go through the ISAs' unaligned intrinsics, which need nothing of the kind. */
#ifndef SDPA_ARCH_ANY_ADDRESS_H
#define SDPA_ARCH_ANY_ADDRESS_H

#include <stdint.h>

typedef float f32_any __attribute__((aligned(1)));
typedef uint16_t u16_any __attribute__((aligned(1)));

static inline float load_f32(const f32_any *p) { return *p; }
static inline void store_f32(f32_any *p, float x) { *p = x; }

#endif
