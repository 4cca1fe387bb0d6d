/* tilecore CPU backend prelude: helpers the generated C relies on. Inlined into every kernel source. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- 16-bit floats are stored as uint16_t and computed in float ------------------------------- */
#if defined(__FLT16_MAX__) && !defined(TC_SOFT_HALF)
/* The compiler's _Float16 converts with round-to-nearest-even (in hardware where the CPU has it,
   which also lets loops vectorize); the software versions below are the portable fallback. */
static inline float tc_h2f(uint16_t h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline uint16_t tc_f2h(float x) { _Float16 f = (_Float16)x; uint16_t h; memcpy(&h, &f, 2); return h; }
#else
static inline float tc_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) { bits = sign; }
    else { /* subnormal: normalise */
      int e = -1;
      do { e++; man <<= 1; } while ((man & 0x400u) == 0);
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) { bits = sign | 0x7f800000u | (man << 13); }
  else { bits = sign | ((exp + 127 - 15) << 23) | (man << 13); }
  float f; memcpy(&f, &bits, 4); return f;
}

static inline uint16_t tc_f2h(float f) { /* round to nearest even, with overflow to inf and NaN kept */
  uint32_t x; memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (absx < 0x38800000u) { /* subnormal or zero in half */
    if (absx < 0x33000000u) return (uint16_t)sign;
    /* |f| = man * 2^(e-150) with the implicit bit in man; in units of 2^-24 that is man >> (126 - e) */
    uint32_t man = (absx & 0x7fffffu) | 0x800000u;
    int rshift = 126 - (int)(absx >> 23);
    uint32_t q = man >> rshift, rem = man & ((1u << rshift) - 1), halfway = 1u << (rshift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t e = (absx >> 23) - 127 + 15, man = absx & 0x7fffffu;
  uint32_t q = (e << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
  return (uint16_t)(sign | q);
}
#endif

static inline float tc_bf2f(uint16_t b) { uint32_t x = (uint32_t)b << 16; float f; memcpy(&f, &x, 4); return f; }

static inline uint16_t tc_f2bf(float f) {
  uint32_t x; memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static inline float tc_round_h(float f) { return tc_h2f(tc_f2h(f)); }
static inline float tc_round_bf(float f) { return tc_bf2f(tc_f2bf(f)); }

/* ---- 8-bit floats (float8_e4m3fn, float8_e5m2) are stored as uint8_t and computed in float -------- */
/* Conversions as torch's (bit for bit): round to nearest even; NaN -> 0x7f with the sign kept;
   e4m3fn has no inf, so values past its largest finite one (448) and inf saturate to +-448;
   e5m2 overflows to +-inf as IEEE formats do. */

/* |f| (float bits a, not NaN, below the format's overflow bound) to an 8-bit float with M mantissa bits
   and exponent bias B, rounded to nearest even */
static inline uint8_t tc_f8_round(uint32_t a, int M, int B) {
  int e = (int)(a >> 23);
  uint32_t q, rem, half;
  if (e < 128 - B) { /* below the smallest normal 2^(1-B): count in units of the smallest subnormal */
    int rshift = 151 - B - M - e; /* |f| = man * 2^(e-150) = (man >> rshift) units of 2^(1-B-M) */
    if (rshift > 24) return 0;    /* under half the smallest subnormal (float subnormals included) */
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    q = man >> rshift; rem = man & ((1u << rshift) - 1); half = 1u << (rshift - 1);
  } else {
    q = ((uint32_t)(e - 127 + B) << M) | ((a & 0x7fffffu) >> (23 - M));
    rem = a & ((1u << (23 - M)) - 1); half = 1u << (22 - M);
  }
  if (rem > half || (rem == half && (q & 1u))) q++; /* a carry into the exponent is the right result */
  return (uint8_t)q;
}

/* an 8-bit float's finite value (M mantissa bits, bias B), exactly */
static inline float tc_f8_value(uint8_t v, int M, int B) {
  uint32_t e = (v & 0x7fu) >> M, man = v & ((1u << M) - 1), bits;
  if (e) {
    bits = ((e - B + 127) << 23) | (man << (23 - M));
  } else if (man == 0) {
    bits = 0;
  } else { /* subnormal: man * 2^(1-B-M); normalise */
    int k = 0;
    while (!(man & (1u << M))) { man <<= 1; k++; }
    bits = ((uint32_t)(128 - B - k) << 23) | ((man & ((1u << M) - 1)) << (23 - M));
  }
  bits |= (uint32_t)(v & 0x80u) << 24;
  float f; memcpy(&f, &bits, 4); return f;
}

static inline float tc_e4m3_to_f(uint8_t v) {
  if ((v & 0x7fu) == 0x7fu) { /* NaN (the only one e4m3fn has) */
    uint32_t bits = ((uint32_t)(v & 0x80u) << 24) | 0x7ff00000u; float f; memcpy(&f, &bits, 4); return f;
  }
  return tc_f8_value(v, 3, 7);
}

static inline uint8_t tc_f_to_e4m3(float f) {
  uint32_t x; memcpy(&x, &f, 4);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;  /* NaN */
  if (a > 0x43e80000u) return sign | 0x7eu;  /* past 464 (448 + half an ulp), inf too: +-448 */
  return sign | tc_f8_round(a, 3, 7);
}

static inline float tc_e5m2_to_f(uint8_t v) {
  if ((v & 0x7cu) == 0x7cu) { /* exponent all ones: inf, or NaN (quiet, payload kept as torch does) */
    uint32_t man = v & 0x3u;
    uint32_t bits = ((uint32_t)(v & 0x80u) << 24) | 0x7f800000u | (man ? 0x400000u | (man << 21) : 0);
    float f; memcpy(&f, &bits, 4); return f;
  }
  return tc_f8_value(v, 2, 15);
}

static inline uint8_t tc_f_to_e5m2(float f) {
  uint32_t x; memcpy(&x, &f, 4);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;  /* NaN */
  if (a >= 0x47700000u) return sign | 0x7cu; /* from 61440 (57344 + half an ulp, a tie to even 2^16): inf */
  return sign | tc_f8_round(a, 2, 15);
}

static inline float tc_round_e4m3(float f) { return tc_e4m3_to_f(tc_f_to_e4m3(f)); }
static inline float tc_round_e5m2(float f) { return tc_e5m2_to_f(tc_f_to_e5m2(f)); }

/* ---- integer helpers ---------------------------------------------------------------------------- */
static inline int64_t tc_floordiv(int64_t a, int64_t b) { int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t tc_floormod(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
#define tc_iabs(x) ((x) < 0 ? -(x) : (x))
#define tc_max(a, b) ({ __typeof__(a) tc_a_ = (a); __typeof__(b) tc_b_ = (b); tc_a_ > tc_b_ ? tc_a_ : tc_b_; })
#define tc_min(a, b) ({ __typeof__(a) tc_a_ = (a); __typeof__(b) tc_b_ = (b); tc_a_ < tc_b_ ? tc_a_ : tc_b_; })
/* float min / max: a NaN in either operand gives NaN (T.max, T.min, T.reduce_max... unless fast math) */
#define tc_nanmax(a, b) ({ __typeof__(a) tc_a_ = (a); __typeof__(b) tc_b_ = (b); \
  (tc_a_ != tc_a_ || tc_b_ != tc_b_) ? tc_a_ + tc_b_ : (tc_a_ > tc_b_ ? tc_a_ : tc_b_); })
#define tc_nanmin(a, b) ({ __typeof__(a) tc_a_ = (a); __typeof__(b) tc_b_ = (b); \
  (tc_a_ != tc_a_ || tc_b_ != tc_b_) ? tc_a_ + tc_b_ : (tc_a_ < tc_b_ ? tc_a_ : tc_b_); })

/* ---- atomics: compare-and-swap loops on the storage bits ---------------------------------------- */
#define TC_ATOMIC_CAS(NAME, STORE_T, BITS_T, LOAD, STOREV, OP)                                     \
  static inline void NAME(STORE_T* p, double v) {                                                \
    BITS_T* ip = (BITS_T*)p; BITS_T old = __atomic_load_n(ip, __ATOMIC_RELAXED), nw;             \
    do { STORE_T cur; memcpy(&cur, &old, sizeof cur); double c = (double)LOAD(cur);               \
         double r = OP; STORE_T out = STOREV(r); memcpy(&nw, &out, sizeof nw);                   \
    } while (!__atomic_compare_exchange_n(ip, &old, nw, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)); \
  }
#define TC_ID(x) (x)
#define TC_F32(x) ((float)(x))
#define TC_F64(x) ((double)(x))
#define TC_I32(x) ((int32_t)(x))
#define TC_I64(x) ((int64_t)(x))
#define TC_H(x) tc_f2h((float)(x))
#define TC_BF(x) tc_f2bf((float)(x))
#define TC_ATOMIC_ALL(SUFFIX, STORE_T, BITS_T, LOAD, STOREV)                                        \
  TC_ATOMIC_CAS(tc_atomic_add_##SUFFIX, STORE_T, BITS_T, LOAD, STOREV, c + v)                    \
  TC_ATOMIC_CAS(tc_atomic_max_##SUFFIX, STORE_T, BITS_T, LOAD, STOREV, (v > c ? v : c))          \
  TC_ATOMIC_CAS(tc_atomic_min_##SUFFIX, STORE_T, BITS_T, LOAD, STOREV, (v < c ? v : c))
TC_ATOMIC_ALL(float32, float, uint32_t, TC_ID, TC_F32)
TC_ATOMIC_ALL(float64, double, uint64_t, TC_ID, TC_F64)
TC_ATOMIC_ALL(float16, uint16_t, uint16_t, tc_h2f, TC_H)
TC_ATOMIC_ALL(bfloat16, uint16_t, uint16_t, tc_bf2f, TC_BF)

/* integer atomics use the native read-modify-write builtins */
#define TC_ATOMIC_INT(SUFFIX, T)                                                                    \
  static inline void tc_atomic_add_##SUFFIX(T* p, T v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
  static inline void tc_atomic_max_##SUFFIX(T* p, T v) {                                         \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                 \
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} } \
  static inline void tc_atomic_min_##SUFFIX(T* p, T v) {                                         \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                 \
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} }
TC_ATOMIC_INT(int32, int32_t)
TC_ATOMIC_INT(int64, int64_t)
TC_ATOMIC_INT(uint32, uint32_t)
TC_ATOMIC_INT(uint64, uint64_t)

/* ---- per-thread scratch for block-local buffers -------------------------------------------------- */
static inline void* tc_alloc(size_t bytes) {
  size_t n = (bytes + 63) & ~(size_t)63;
  return aligned_alloc(64, n ? n : 64);
}

static inline void tc_set_status(volatile int* status, int code) {
  int expected = 0;
  __atomic_compare_exchange_n((int*)status, &expected, code, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* like tc_set_status; true for the one caller whose code was stored (it records the failure's values) */
static inline int tc_claim_status(volatile int* status, int code) {
  int expected = 0;
  return __atomic_compare_exchange_n((int*)status, &expected, code, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
