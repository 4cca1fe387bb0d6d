// tc_ascend.h: scalar helpers the generated AscendC uses (the C-family emitter's spellings), for the
// scalar unit. Included after kernel_operator.h (CANN) or ascendc_emu.h (the emulator).
#pragma once
#include <cmath>
#include <cstdint>
#ifndef TC_ASCEND_EMU
#define TC_EMU_NAME(t, n)  // names a tile for the emulator's messages; nothing on the device
#endif
template <typename A, typename B> __aicore__ inline A tc_max(A a, B b) { return a > (A)b ? a : (A)b; }
template <typename A, typename B> __aicore__ inline A tc_min(A a, B b) { return a < (A)b ? a : (A)b; }
template <typename A, typename B> __aicore__ inline A tc_nanmax(A a, B b) { return (a != a || b != b) ? (A)NAN : (a > (A)b ? a : (A)b); }
template <typename A, typename B> __aicore__ inline A tc_nanmin(A a, B b) { return (a != a || b != b) ? (A)NAN : (a < (A)b ? a : (A)b); }
template <typename A> __aicore__ inline A tc_iabs(A x) { return x < 0 ? -x : x; }
__aicore__ inline int64_t tc_floordiv(int64_t a, int64_t b) { int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
__aicore__ inline int64_t tc_floormod(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
__aicore__ inline float tc_round_h(float f) { return (float)(half)f; }
__aicore__ inline float tc_round_bf(float f) { return (float)(bfloat16_t)f; }
