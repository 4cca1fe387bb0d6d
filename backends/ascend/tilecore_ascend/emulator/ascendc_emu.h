// ascendc_emu.h: the subset of the AscendC API that tilecore-ascend's code generator emits, run on the
// host CPU AND checked. Written for tilecore (no CANN header is used or copied).
//
// Functional: every instruction executes at once, in program order, so results are those of a correct
// schedule. That alone would hide every missing flag, so each instruction also advances its pipe's
// logical clock and touches 32-byte shadow granules of the on-chip buffers; the checker reports
//   RAW  a pipe reads a granule another pipe (or V itself, without PipeBarrier<PIPE_V>; a pipe's own writes
//        are in order) wrote, with no
//        SetFlag/WaitFlag chain that orders the write before the read;
//   WAR  a pipe overwrites a granule another pipe read, without such a chain (buffer reuse);
//   WAW  two pipes write a granule without ordering;
//   scope capacity (UB, L1, L0A, L0B, L0C), 32-byte alignment of every UB operand,
//   unbalanced flags (a SetFlag never waited, a WaitFlag with no SetFlag: a hang on hardware),
//   event IDs outside the target's 0..TC_EMU_EVENT_IDS-1, and a SetFlag on an event ID whose flag is still
//   set (the flag is one bit: the second set is lost, so a kernel that runs out of IDs or reuses one
//   while it is pending is wrong on hardware).
// Ordering is tracked with vector clocks: VC[p][q] is the newest instruction of pipe q that pipe p is
// known to run after. SetFlag<X_Y> snapshots VC[X]; WaitFlag<X_Y> merges the snapshot into VC[Y].
// Each finding names the buffer, the pipes and the generated source line (__builtin_LINE of the call).
// Capacities come from the target's capability profile as -DTC_EMU_UB_BYTES=... (runtime.py).
// Timing (cycle-ish, a relative measure only): every instruction costs its pipe a rough number of cycles
// from its size; it starts when its pipe is free and the scalar unit has issued it, a WaitFlag holds its
// pipe until the matching SetFlag's pipe had finished the work before the set. The per-core makespan
// against the sum of all instruction costs shows how much the pipes overlap (tc_emu_cycles).
#pragma once
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#ifndef TC_EMU_UB_BYTES
#define TC_EMU_UB_BYTES 196608
#endif
#ifndef TC_EMU_L1_BYTES
#define TC_EMU_L1_BYTES 524288
#endif
#ifndef TC_EMU_EVENT_IDS
#define TC_EMU_EVENT_IDS 8
#endif
#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR uint8_t*
#define KERNEL_TASK_TYPE_DEFAULT(x)
#define TC_EMU_NAME(t, n) tc_emu_name((t), (n), sizeof(n) ? __LINE__ : 0)

struct half {  // IEEE binary16 storage; arithmetic is done in float (value type of the emitter)
  uint16_t bits;
  half() : bits(0) {}
  half(float f) : bits(tc_emu_f2h(f)) {}
  operator float() const { return tc_emu_h2f(bits); }
  static uint16_t tc_emu_f2h(float f) { _Float16 h = (_Float16)f; uint16_t b; std::memcpy(&b, &h, 2); return b; }
  static float tc_emu_h2f(uint16_t b) { _Float16 h; std::memcpy(&h, &b, 2); return (float)h; }
};
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() : bits(0) {}
  bfloat16_t(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { bits = (uint16_t)((u >> 16) | 0x40); return; }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = (uint16_t)(u >> 16);
  }
  operator float() const { uint32_t u = (uint32_t)bits << 16; float f; std::memcpy(&f, &u, 4); return f; }
};

namespace AscendC {
enum class TPosition { GM, A1, A2, B1, B2, CO1, CO2, VECIN, VECOUT, VECCALC };
enum pipe_t { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_FIX, PIPE_ALL };
enum class HardEvent { MTE2_V, V_MTE2, V_MTE3, MTE3_V, MTE2_S, S_MTE2, V_S, S_V, MTE3_S, S_MTE3, MTE3_MTE2,
                       MTE2_MTE3, MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, M_FIX, FIX_M, FIX_S, S_FIX, M_V, V_M };
enum class RoundMode { CAST_NONE, CAST_RINT, CAST_ROUND };
}  // namespace AscendC

// -- checker state ------------------------------------------------------------------------------------
namespace tc_emu {
constexpr int NP = 7, PIPE_V_ID = 1;
static const char* const PIPE_NAMES[NP] = {"S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX"};
enum Scope { UB = 0, L1, L0A, L0B, L0C, NSCOPE };
static const char* const SCOPE_NAMES[NSCOPE] = {"UB", "L1", "L0A", "L0B", "L0C"};
static const uint32_t CAP[NSCOPE] = {TC_EMU_UB_BYTES, TC_EMU_L1_BYTES, 65536, 65536, 131072};
struct Granule { int8_t wpipe; uint64_t wclk; int wline; uint64_t rclk[NP]; int rline[NP]; };
struct Name { uint32_t lo, hi; const char* name; };
struct State {
  uint8_t* mem[NSCOPE];
  Granule* shadow[NSCOPE];
  uint32_t used[NSCOPE];
  Name names[NSCOPE][64];
  int nnames[NSCOPE];
  uint64_t clk[NP], vc[NP][NP], vbar;
  int flag_count[32][16];   // pending SetFlag per (event, id): 0 or 1 (the flag is one bit)
  uint64_t flag_tok[32][16][NP];
  int flag_line[32][16];
  double flag_time[32][16];
  double t[NP];              // timing: when each pipe is free (cycles, per core)
  double makespan, work;     // summed over the cores run since tc_emu_reset_findings
  int findings;
  int said[256][3], nsaid;  // (kind, first line, second line) of the hazards reported: each once
  char log[8192];
  int loglen;
  int block, nblocks, core_type, sub, ratio;  // core_type 1 = AIV, 2 = AIC; sub: the AIV sub-block
  int ratio_of_group;                         // AIV sub-blocks per AIC in this launch (2 for MIX_AIC_1_2)
  // the GM workspace of the cube->vector hand-off: per 32-byte granule the hand-off clock of its last write
  uint8_t* ws; uint64_t ws_bytes; uint64_t* ws_stamp; uint64_t cross_clk, cross_known;
  int cross_count[2][16]; uint64_t cross_tok[16]; int cross_line[16];  // count per AIV sub-block
};
inline State& S() { static State s; return s; }
inline void finding(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void finding(const char* fmt, ...) {
  State& s = S();
  s.findings++;
  if (s.loglen > (int)sizeof(s.log) - 300) return;
  s.loglen += std::snprintf(s.log + s.loglen, sizeof(s.log) - s.loglen, "ASCEND-EMU block %d: ", s.block);
  va_list ap; va_start(ap, fmt);
  s.loglen += std::vsnprintf(s.log + s.loglen, sizeof(s.log) - s.loglen, fmt, ap);
  va_end(ap);
  s.loglen += std::snprintf(s.log + s.loglen, sizeof(s.log) - s.loglen, "\n");
}
inline bool said_before(int kind, int l1, int l2) {
  State& s = S();
  for (int k = 0; k < s.nsaid; ++k)
    if (s.said[k][0] == kind && s.said[k][1] == l1 && s.said[k][2] == l2) { s.findings++; return true; }
  if (s.nsaid < 256) { s.said[s.nsaid][0] = kind; s.said[s.nsaid][1] = l1; s.said[s.nsaid][2] = l2; s.nsaid++; }
  return false;
}
inline const char* name_of(int scope, uint32_t off) {
  State& s = S();
  for (int k = s.nnames[scope] - 1; k >= 0; --k)
    if (off >= s.names[scope][k].lo && off < s.names[scope][k].hi) return s.names[scope][k].name;
  return "?";
}
inline void reset_block() {
  State& s = S();
  for (int k = 0; k < NSCOPE; ++k) {
    if (!s.mem[k]) {
      s.mem[k] = (uint8_t*)std::aligned_alloc(64, CAP[k]);
      s.shadow[k] = (Granule*)std::calloc(CAP[k] / 32, sizeof(Granule));
    }
    std::memset(s.mem[k], 0, CAP[k]);
    for (uint32_t g = 0; g < CAP[k] / 32; ++g) s.shadow[k][g].wpipe = -1;
    std::memset(s.shadow[k], 0, CAP[k] / 32 * sizeof(Granule));
    for (uint32_t g = 0; g < CAP[k] / 32; ++g) s.shadow[k][g].wpipe = -1;
    s.used[k] = 0;
    s.nnames[k] = 0;
  }
  std::memset(s.clk, 0, sizeof(s.clk));
  std::memset(s.vc, 0, sizeof(s.vc));
  s.vbar = 0;
  std::memset(s.flag_count, 0, sizeof(s.flag_count));
  std::memset(s.t, 0, sizeof(s.t));
}
inline uint64_t tick(int pipe, double cost = 1) {
  State& s = S();
  s.vc[pipe][pipe] = ++s.clk[pipe];
  double start = s.t[pipe] > s.t[0] ? s.t[pipe] : s.t[0];  // the scalar unit issues every instruction in order
  if (pipe != 0) s.t[0] += 1;
  s.t[pipe] = start + cost;
  s.work += cost;
  return s.clk[pipe];
}
// rough cycle costs: DMA 64 bytes a cycle after a 64-cycle start, vector 256 bytes (one repeat) a cycle
inline double dma_cost(double bytes) { return 64 + bytes / 64; }
inline double vec_cost(double bytes) { return 4 + (bytes + 255) / 256; }
// one access of bytes [off, off+n) of a scope by `pipe` at instruction clock c
inline void access(int scope, uint32_t off, uint32_t n, int pipe, bool write, uint64_t c, int line) {
  State& s = S();
  if (n == 0) return;
  if ((uint64_t)off + n > CAP[scope]) {
    finding("%s access of %u bytes at offset %u runs past the %s (%u bytes), line %d", PIPE_NAMES[pipe], n, off,
            SCOPE_NAMES[scope], CAP[scope], line);
    return;
  }
  bool raw_said = false, war_said = false;  // one finding of each kind per instruction operand
  for (uint32_t g = off / 32; g <= (off + n - 1) / 32; ++g) {
    Granule& gr = s.shadow[scope][g];
    if (gr.wpipe >= 0) {
      int w = gr.wpipe;
      // another pipe: a flag chain; V after V: PipeBarrier<PIPE_V>; other pipes run their own queue in order
      bool ordered = w != pipe ? s.vc[pipe][w] >= gr.wclk : (pipe != PIPE_V_ID || write || s.vbar >= gr.wclk);
      if (!ordered && !raw_said) {
        raw_said = true;
        if (!said_before(write ? 1 : 0, gr.wline, line))
        finding("%s: %s %s %s-buffer '%s' (offset %u) written by %s at line %d with no %s->%s sync, line %d",
                write ? "WAW" : "RAW", PIPE_NAMES[pipe], write ? "writes" : "reads", SCOPE_NAMES[scope],
                name_of(scope, g * 32), g * 32, PIPE_NAMES[w], gr.wline, PIPE_NAMES[w], PIPE_NAMES[pipe], line);
      }
    }
    if (write) {
      for (int r = 0; r < NP; ++r) {
        if (r == pipe || gr.rclk[r] == 0) continue;
        if (s.vc[pipe][r] < gr.rclk[r] && !war_said) {
          war_said = true;
          if (!said_before(2, gr.rline[r], line))
          finding("WAR: %s overwrites %s-buffer '%s' (offset %u) read by %s at line %d with no %s->%s sync, line %d",
                  PIPE_NAMES[pipe], SCOPE_NAMES[scope], name_of(scope, g * 32), g * 32, PIPE_NAMES[r], gr.rline[r],
                  PIPE_NAMES[r], PIPE_NAMES[pipe], line);
        }
      }
      std::memset(gr.rclk, 0, sizeof(gr.rclk));
      gr.wpipe = (int8_t)pipe; gr.wclk = c; gr.wline = line;
    } else {
      gr.rclk[pipe] = c; gr.rline[pipe] = line;
    }
  }
}
inline void check_align(int scope, uint32_t off, uint32_t align, const char* what, int line) {
  if (off % align)
    finding("alignment: %s operand '%s' at %s offset %u is not %u-byte aligned, line %d", what,
            name_of(scope, off), SCOPE_NAMES[scope], off, align, line);
}
inline int event_index(AscendC::HardEvent e) { return (int)e; }
inline void event_pipes(AscendC::HardEvent e, int& src, int& dst) {
  using H = AscendC::HardEvent;
  static const int tab[][2] = {{4, 1}, {1, 4}, {1, 5}, {5, 1}, {4, 0}, {0, 4}, {1, 0}, {0, 1}, {5, 0}, {0, 5},
                               {5, 4}, {4, 5}, {4, 3}, {3, 4}, {3, 2}, {2, 3}, {2, 6}, {6, 2}, {6, 0}, {0, 6},
                               {2, 1}, {1, 2}};
  (void)sizeof(H);
  src = tab[(int)e][0]; dst = tab[(int)e][1];
}
}  // namespace tc_emu

inline void tc_emu_name_range(int scope, uint32_t lo, uint32_t hi, const char* name) {
  tc_emu::State& s = tc_emu::S();
  if (s.nnames[scope] < 64) s.names[scope][s.nnames[scope]++] = {lo, hi, name};
}

namespace AscendC {
// -- tensors ------------------------------------------------------------------------------------------
inline void ws_access(const void* p, uint64_t n, bool write, int line) {
  using namespace tc_emu;
  State& s = S();
  const uint8_t* b = (const uint8_t*)p;
  if (!s.ws || b < s.ws || b >= s.ws + s.ws_bytes || n == 0) return;
  for (uint64_t g = (uint64_t)(b - s.ws) / 32; g <= (uint64_t)(b - s.ws + n - 1) / 32; ++g) {
    if (write) { s.ws_stamp[g] = ++s.cross_clk; continue; }
    if (s.ws_stamp[g] > s.cross_known) {
      if (!said_before(3, 0, line))
        finding("RAW across cores: the AIV reads the GM workspace (offset %llu) the AIC wrote with no "
                "CrossCoreSetFlag/CrossCoreWaitFlag after the write, line %d", (unsigned long long)g * 32, line);
      return;
    }
  }
}
template <typename T> struct GlobalTensor {
  T* ptr = nullptr;
  void SetGlobalBuffer(__gm__ T* p) { ptr = p; }
  GlobalTensor operator[](int64_t i) const { GlobalTensor g; g.ptr = ptr + i; return g; }
  T GetValue(int64_t i) const { return ptr[i]; }
  void SetValue(int64_t i, T v) { ptr[i] = v; }
};
template <typename T> struct LocalTensor {
  int scope = 0;
  uint32_t off = 0;   // bytes from the scope's start
  uint32_t count = 0; // elements
  T* data() const { return (T*)(tc_emu::S().mem[scope] + off); }
  LocalTensor operator[](uint32_t i) const { LocalTensor t = *this; t.off += i * sizeof(T); t.count -= i; return t; }
  T GetValue(uint32_t i, int line = __builtin_LINE()) const {
    uint64_t c = tc_emu::tick(PIPE_S);
    tc_emu::access(scope, off + i * sizeof(T), sizeof(T), PIPE_S, false, c, line);
    return data()[i];
  }
  void SetValue(uint32_t i, T v, int line = __builtin_LINE()) const {
    uint64_t c = tc_emu::tick(PIPE_S);
    tc_emu::access(scope, off + i * sizeof(T), sizeof(T), PIPE_S, true, c, line);
    data()[i] = v;
  }
};
template <TPosition P> struct TBuf {
  int scope = 0;
  uint32_t base = 0, bytes = 0;
  template <typename T> LocalTensor<T> Get() const { LocalTensor<T> t; t.scope = scope; t.off = base; t.count = bytes / sizeof(T); return t; }
  template <typename T> LocalTensor<T> GetWithOffset(uint32_t count, uint32_t offset) const {
    LocalTensor<T> t; t.scope = scope; t.off = base + offset; t.count = count; return t;
  }
};
struct TPipe {
  template <TPosition P> void InitBuffer(TBuf<P>& buf, uint32_t bytes, int line = __builtin_LINE()) {
    using namespace tc_emu;
    int scope = (P == TPosition::A1 || P == TPosition::B1) ? L1 : P == TPosition::A2 ? L0A : P == TPosition::B2 ? L0B
              : P == TPosition::CO1 ? L0C : UB;
    State& s = S();
    uint32_t base = (s.used[scope] + 31u) / 32u * 32u;
    if ((uint64_t)base + bytes > CAP[scope]) {
      finding("capacity: InitBuffer of %u bytes in %s at offset %u exceeds its %u bytes, line %d", bytes,
              SCOPE_NAMES[scope], base, CAP[scope], line);
      bytes = base < CAP[scope] ? CAP[scope] - base : 0;
    }
    buf.scope = scope; buf.base = base; buf.bytes = bytes;
    s.used[scope] = base + bytes;
  }
};
}  // namespace AscendC

template <typename T> inline void tc_emu_name(const AscendC::LocalTensor<T>& t, const char* name, int) {
  tc_emu_name_range(t.scope, t.off, t.off + t.count * (uint32_t)sizeof(T), name);
}

namespace AscendC {
inline int64_t GetBlockIdx() { return tc_emu::S().core_type == 1 ? tc_emu::S().ratio * tc_emu::S().block + tc_emu::S().sub : tc_emu::S().block; }
inline int64_t GetBlockNum() { return tc_emu::S().nblocks; }
inline int64_t GetSubBlockIdx() { return tc_emu::S().sub; }
inline int64_t GetTaskRation() { return tc_emu::S().core_type == 1 ? tc_emu::S().ratio : 1; }
#define ASCEND_IS_AIV (tc_emu::S().core_type == 1)
#define ASCEND_IS_AIC (tc_emu::S().core_type == 2)

// -- synchronization ----------------------------------------------------------------------------------
template <HardEvent E> inline void SetFlag(int id, int line = __builtin_LINE()) {
  using namespace tc_emu;
  State& s = S();
  int src, dst; event_pipes(E, src, dst);
  if (id < 0 || id >= TC_EMU_EVENT_IDS) {
    finding("event ID %d of SetFlag<%s_%s> outside the target's 0..%d, line %d", id, PIPE_NAMES[src], PIPE_NAMES[dst],
            TC_EMU_EVENT_IDS - 1, line);
    return;
  }
  int e = event_index(E), &n = s.flag_count[e][id];
  if (n) {
    finding("event ID reused: SetFlag<%s_%s>(%d) while the flag set at line %d is still pending (one bit: this set is "
            "lost; the IDs are exhausted or one is reused), line %d", PIPE_NAMES[src], PIPE_NAMES[dst], id,
            s.flag_line[e][id], line);
    return;
  }
  for (int q = 0; q < NP; ++q) s.flag_tok[e][id][q] = s.vc[src][q];
  s.flag_line[e][id] = line;
  s.flag_time[e][id] = s.t[src] > s.t[0] ? s.t[src] : s.t[0];
  s.t[0] += 1;
  n = 1;
}
template <HardEvent E> inline void WaitFlag(int id, int line = __builtin_LINE()) {
  using namespace tc_emu;
  State& s = S();
  int src, dst; event_pipes(E, src, dst);
  if (id < 0 || id >= TC_EMU_EVENT_IDS) {
    finding("event ID %d of WaitFlag<%s_%s> outside the target's 0..%d, line %d", id, PIPE_NAMES[src], PIPE_NAMES[dst],
            TC_EMU_EVENT_IDS - 1, line);
    return;
  }
  int e = event_index(E), &n = s.flag_count[e][id];
  if (n == 0) { finding("unbalanced: WaitFlag<%s_%s>(%d) with no SetFlag before it (a hang), line %d", PIPE_NAMES[src], PIPE_NAMES[dst], id, line); return; }
  for (int q = 0; q < NP; ++q)
    if (s.flag_tok[e][id][q] > s.vc[dst][q]) s.vc[dst][q] = s.flag_tok[e][id][q];
  double ready = s.flag_time[e][id];
  if (dst != 0) s.t[0] += 1;
  if (s.t[dst] < ready) s.t[dst] = ready;
  n = 0;
}
// cube <-> vector flags of one AI Core group (mode 2): the AIC sets after its pipe P finished, the AIV waits
template <int MODE, pipe_t P> inline void CrossCoreSetFlag(int id, int line = __builtin_LINE()) {
  using namespace tc_emu;
  State& s = S();
  if (id < 0 || id > 10) { finding("cross-core flag ID %d outside 0..10 (Atlas A2/A3), line %d", id, line); return; }
  if (s.cross_count[0][id] >= 15) { finding("cross-core flag %d set 15 times without a wait (its counter's limit), line %d", id, line); return; }
  // mode 2 (Ascend C API reference, CrossCoreSetFlag): after the AIC sets, both AIVs of the group pass their
  // CrossCoreWaitFlag: the flag is raised for each AIV sub-block, and each must wait for its own
  for (int v = 0; v < (MODE == 2 ? s.ratio_of_group : 1); ++v) s.cross_count[v][id]++;
  s.cross_tok[id] = s.cross_clk; s.cross_line[id] = line;
}
inline void CrossCoreWaitFlag(int id, int line = __builtin_LINE()) {
  using namespace tc_emu;
  State& s = S();
  if (id < 0 || id > 10) { finding("cross-core flag ID %d outside 0..10 (Atlas A2/A3), line %d", id, line); return; }
  int& n = s.cross_count[s.sub & 1][id];
  if (n == 0) { finding("unbalanced: CrossCoreWaitFlag(%d) on AIV sub-block %d with no CrossCoreSetFlag (a hang), line %d", id, s.sub, line); return; }
  n--;
  if (s.cross_tok[id] > s.cross_known) s.cross_known = s.cross_tok[id];
}
template <pipe_t P> inline void PipeBarrier() {
  using namespace tc_emu;
  State& s = S();
  if (P == PIPE_V) s.vbar = s.clk[1];
  if (P == PIPE_ALL) {
    for (int p = 0; p < NP; ++p) for (int q = 0; q < NP; ++q) s.vc[p][q] = s.clk[q];
    s.vbar = s.clk[1];
    double all = 0;
    for (int p = 0; p < NP; ++p) all = s.t[p] > all ? s.t[p] : all;
    for (int p = 0; p < NP; ++p) s.t[p] = all;
  }
}

// -- data movement ------------------------------------------------------------------------------------
struct DataCopyExtParams {
  uint16_t blockCount; uint32_t blockLen; uint32_t srcStride; uint32_t dstStride; uint32_t rsv;
  DataCopyExtParams(uint16_t c = 1, uint32_t l = 0, uint32_t s = 0, uint32_t d = 0, uint32_t r = 0)
      : blockCount(c), blockLen(l), srcStride(s), dstStride(d), rsv(r) {}
};
template <typename T> struct DataCopyPadExtParams {
  bool isPad; uint8_t leftPadding, rightPadding; T paddingValue;
  DataCopyPadExtParams(bool p = false, uint8_t l = 0, uint8_t r = 0, T v = T()) : isPad(p), leftPadding(l), rightPadding(r), paddingValue(v) {}
};
// GM -> UB on MTE2: blockCount rows of blockLen bytes; GM rows srcStride bytes apart (gap); UB rows padded
// to 32 bytes plus dstStride 32-byte blocks
template <typename T> inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                                              const DataCopyPadExtParams<T>&, int line = __builtin_LINE()) {
  using namespace tc_emu;
  check_align(dst.scope, dst.off, 32, "DataCopyPad destination", line);
  uint64_t c = tick(PIPE_MTE2, dma_cost((double)p.blockCount * p.blockLen));
  uint32_t pitch = (p.blockLen + 31u) / 32u * 32u + p.dstStride * 32u;
  const uint8_t* s8 = (const uint8_t*)src.ptr;
  for (uint32_t r = 0; r < p.blockCount; ++r) {
    ws_access(s8 + (uint64_t)r * (p.blockLen + p.srcStride), p.blockLen, false, line);
    access(dst.scope, dst.off + r * pitch, p.blockLen, PIPE_MTE2, true, c, line);
    std::memcpy(S().mem[dst.scope] + dst.off + r * pitch, s8 + (uint64_t)r * (p.blockLen + p.srcStride), p.blockLen);
  }
}
// UB -> GM on MTE3: UB rows 32-byte padded plus srcStride blocks; GM rows dstStride bytes apart (gap)
template <typename T> inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p,
                                              int line = __builtin_LINE()) {
  using namespace tc_emu;
  check_align(src.scope, src.off, 32, "DataCopyPad source", line);
  uint64_t c = tick(PIPE_MTE3, dma_cost((double)p.blockCount * p.blockLen));
  uint32_t pitch = (p.blockLen + 31u) / 32u * 32u + p.srcStride * 32u;
  uint8_t* d8 = (uint8_t*)dst.ptr;
  for (uint32_t r = 0; r < p.blockCount; ++r) {
    access(src.scope, src.off + r * pitch, p.blockLen, PIPE_MTE3, false, c, line);
    std::memcpy(d8 + (uint64_t)r * (p.blockLen + p.dstStride), S().mem[src.scope] + src.off + r * pitch, p.blockLen);
  }
}

// -- vector instructions (count form) -----------------------------------------------------------------
namespace tc_vec {
template <typename T> inline void operand(const LocalTensor<T>& t, uint32_t n, bool write, uint64_t c, int line, const char* what) {
  tc_emu::check_align(t.scope, t.off, 32, what, line);
  tc_emu::access(t.scope, t.off, n * (uint32_t)sizeof(T), PIPE_V, write, c, line);
}
template <typename T> inline float val(T v) { return (float)v; }
inline double val(double v) { return v; }
inline float nanmax(float a, float b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
inline float nanmin(float a, float b) { return (a != a || b != b) ? NAN : (a < b ? a : b); }
}  // namespace tc_vec
#define TC_EMU_BINARY(NAME, EXPR)                                                                            \
  template <typename T> inline void NAME(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, \
                                         int32_t n, int line = __builtin_LINE()) {                          \
    uint64_t c = tc_emu::tick(PIPE_V, tc_emu::vec_cost((double)n * sizeof(T)));                                \
    tc_vec::operand(a, n, false, c, line, #NAME " source");                                                  \
    tc_vec::operand(b, n, false, c, line, #NAME " source");                                                  \
    tc_vec::operand(d, n, true, c, line, #NAME " destination");                                              \
    for (int32_t i = 0; i < n; ++i) { float x = (float)a.data()[i], y = (float)b.data()[i]; d.data()[i] = (T)(EXPR); } \
  }
TC_EMU_BINARY(Add, x + y)
TC_EMU_BINARY(Sub, x - y)
TC_EMU_BINARY(Mul, x * y)
TC_EMU_BINARY(Div, x / y)
TC_EMU_BINARY(Max, tc_vec::nanmax(x, y))
TC_EMU_BINARY(Min, tc_vec::nanmin(x, y))
#define TC_EMU_SCALAR(NAME, EXPR)                                                                            \
  template <typename T, typename U> inline void NAME(const LocalTensor<T>& d, const LocalTensor<T>& a, U s,   \
                                                     int32_t n, int line = __builtin_LINE()) {              \
    uint64_t c = tc_emu::tick(PIPE_V, tc_emu::vec_cost((double)n * sizeof(T)));                                \
    tc_vec::operand(a, n, false, c, line, #NAME " source");                                                  \
    tc_vec::operand(d, n, true, c, line, #NAME " destination");                                              \
    float y = (float)s;                                                                                      \
    for (int32_t i = 0; i < n; ++i) { float x = (float)a.data()[i]; d.data()[i] = (T)(EXPR); }             \
  }
TC_EMU_SCALAR(Adds, x + y)
TC_EMU_SCALAR(Muls, x * y)
TC_EMU_SCALAR(Maxs, tc_vec::nanmax(x, y))
TC_EMU_SCALAR(Mins, tc_vec::nanmin(x, y))
#define TC_EMU_UNARY(NAME, EXPR)                                                                             \
  template <typename T> inline void NAME(const LocalTensor<T>& d, const LocalTensor<T>& a, int32_t n,         \
                                         int line = __builtin_LINE()) {                                     \
    uint64_t c = tc_emu::tick(PIPE_V, tc_emu::vec_cost((double)n * sizeof(T)));                                \
    tc_vec::operand(a, n, false, c, line, #NAME " source");                                                  \
    tc_vec::operand(d, n, true, c, line, #NAME " destination");                                              \
    for (int32_t i = 0; i < n; ++i) { float x = (float)a.data()[i]; d.data()[i] = (T)(EXPR); }             \
  }
TC_EMU_UNARY(Exp, std::exp(x))
TC_EMU_UNARY(Ln, std::log(x))
TC_EMU_UNARY(Sqrt, std::sqrt(x))
TC_EMU_UNARY(Rsqrt, 1.0f / std::sqrt(x))
TC_EMU_UNARY(Abs, std::fabs(x))
TC_EMU_UNARY(Reciprocal, 1.0f / x)
TC_EMU_UNARY(Relu, x > 0 ? x : (x != x ? x : 0.0f))
template <typename T, typename U> inline void Duplicate(const LocalTensor<T>& d, U s, int32_t n, int line = __builtin_LINE()) {
  uint64_t c = tc_emu::tick(PIPE_V, tc_emu::vec_cost((double)n * sizeof(T)));
  tc_vec::operand(d, n, true, c, line, "Duplicate destination");
  for (int32_t i = 0; i < n; ++i) d.data()[i] = (T)s;
}
template <typename T, typename U> inline void Cast(const LocalTensor<T>& d, const LocalTensor<U>& a, RoundMode, int32_t n,
                                                   int line = __builtin_LINE()) {
  uint64_t c = tc_emu::tick(PIPE_V, tc_emu::vec_cost((double)n * 4));
  tc_vec::operand(a, n, false, c, line, "Cast source");
  tc_vec::operand(d, n, true, c, line, "Cast destination");
  for (int32_t i = 0; i < n; ++i) d.data()[i] = (T)(float)a.data()[i];
}
// whole-vector reductions: the result in dst[0]; `work` is the scratch the instruction needs
#define TC_EMU_REDUCE(NAME, INIT, STEP)                                                                      \
  template <typename T> inline void NAME(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& w, \
                                         int32_t n, int line = __builtin_LINE()) {                          \
    uint64_t c = tc_emu::tick(PIPE_V, tc_emu::vec_cost((double)n * sizeof(T)));                                \
    tc_vec::operand(a, n, false, c, line, #NAME " source");                                                  \
    tc_vec::operand(w, n, true, c, line, #NAME " work");                                                     \
    tc_vec::operand(d, 1, true, c, line, #NAME " destination");                                              \
    float r = INIT;                                                                                          \
    for (int32_t i = 0; i < n; ++i) { float x = (float)a.data()[i]; r = (STEP); }                           \
    d.data()[0] = (T)r;                                                                                      \
  }
TC_EMU_REDUCE(ReduceSum, 0.0f, r + x)
TC_EMU_REDUCE(ReduceMax, -INFINITY, tc_vec::nanmax(r, x))
TC_EMU_REDUCE(ReduceMin, INFINITY, tc_vec::nanmin(r, x))

// -- the cube (16-bit operands: C0 = 16 elements, fractals of 16 x 16 = 512 bytes) -------------------------
// Layouts, as the AscendC documentation describes them: L1 tiles are zN (Nd2Nz: 16-element column blocks,
// each holding every row, so element (r, c) of a tile with R rows is at (c / 16 * R + r) * 16 + c % 16);
// L0A is zZ (fractals row-major, each row-major); L0B is nZ (fractals row-major, each column-major: element
// (k, n) at fractal (k / 16, n / 16) and offset (n % 16) * 16 + k % 16); L0C is zN with float32 elements.
struct Nd2NzParams {
  uint16_t ndNum, nValue, dValue, srcNdMatrixStride, srcDValue, dstNzC0Stride, dstNzNStride, dstNzMatrixStride;
  Nd2NzParams(uint16_t a = 1, uint16_t n = 0, uint16_t d = 0, uint16_t sm = 0, uint16_t sd = 0, uint16_t c0 = 0,
              uint16_t ns = 1, uint16_t ms = 0)
      : ndNum(a), nValue(n), dValue(d), srcNdMatrixStride(sm), srcDValue(sd), dstNzC0Stride(c0), dstNzNStride(ns),
        dstNzMatrixStride(ms) {}
};
template <typename T> inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const Nd2NzParams& p,
                                           int line = __builtin_LINE()) {
  using namespace tc_emu;
  static_assert(sizeof(T) == 2, "the emulated Nd2Nz covers 16-bit elements");
  check_align(dst.scope, dst.off, 32, "DataCopy(Nd2Nz) destination", line);
  uint64_t c = tick(PIPE_MTE2, dma_cost((double)p.nValue * p.dValue * sizeof(T)));
  for (uint32_t r = 0; r < p.nValue; ++r)
    for (uint32_t d = 0; d < p.dValue; ++d) {
      uint32_t at = ((d / 16) * p.dstNzC0Stride + r * p.dstNzNStride) * 16 + d % 16;
      access(dst.scope, dst.off + at * 2, 2, PIPE_MTE2, true, c, line);
      dst.data()[at] = src.ptr[(uint64_t)r * p.srcDValue + d];
    }
}
template <typename T> struct InitConstValueParams {
  uint16_t repeatTimes, blockNum, dstGap; T initValue;
  InitConstValueParams(uint16_t r = 1, uint16_t b = 0, uint16_t g = 0, T v = T()) : repeatTimes(r), blockNum(b), dstGap(g), initValue(v) {}
};
template <typename T> inline void InitConstValue(const LocalTensor<T>& dst, const InitConstValueParams<T>& p,
                                                 int line = __builtin_LINE()) {
  using namespace tc_emu;
  check_align(dst.scope, dst.off, 32, "InitConstValue destination", line);
  uint64_t c = tick(PIPE_MTE2, 8 + (double)p.repeatTimes * p.blockNum / 2);
  uint32_t n = (uint32_t)p.repeatTimes * p.blockNum * 32u;
  access(dst.scope, dst.off, n, PIPE_MTE2, true, c, line);
  for (uint32_t i = 0; i < n / sizeof(T); ++i) dst.data()[i] = p.initValue;
}
struct LoadData2DParams {
  uint16_t startIndex; uint8_t repeatTimes; uint16_t srcStride; uint8_t sid; uint16_t dstGap; bool ifTranspose; uint8_t addrMode;
  LoadData2DParams(uint16_t s = 0, uint8_t r = 1, uint16_t ss = 0, uint8_t si = 0, uint16_t g = 0, bool t = false, uint8_t a = 0)
      : startIndex(s), repeatTimes(r), srcStride(ss), sid(si), dstGap(g), ifTranspose(t), addrMode(a) {}
};
// L1 -> L0A/L0B on MTE1: repeatTimes fractals, source fractal startIndex + i * srcStride, destination i * (1 + dstGap)
template <typename T> inline void LoadData(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2DParams& p,
                                           int line = __builtin_LINE()) {
  using namespace tc_emu;
  check_align(dst.scope, dst.off, 512, "LoadData destination", line);
  check_align(src.scope, src.off, 32, "LoadData source", line);
  uint64_t c = tick(PIPE_MTE1, 4 + 4.0 * p.repeatTimes);  // 512-byte fractals, 128 bytes a cycle
  for (uint32_t i = 0; i < p.repeatTimes; ++i) {
    uint32_t sf = (p.startIndex + i * p.srcStride) * 256u, df = i * (1u + p.dstGap) * 256u;
    access(src.scope, src.off + sf * 2, 512, PIPE_MTE1, false, c, line);
    access(dst.scope, dst.off + df * 2, 512, PIPE_MTE1, true, c, line);
    for (uint32_t r = 0; r < 16; ++r)
      for (uint32_t q = 0; q < 16; ++q)
        dst.data()[df + r * 16 + q] = src.data()[sf + (p.ifTranspose ? q * 16 + r : r * 16 + q)];
  }
}
struct MmadParams {
  uint16_t m, n, k; bool isBias; int32_t fmOffset; bool enSsparse, enWinogradA, enWinogradB; uint8_t unitFlag;
  bool kDirectionAlign, cmatrixSource, cmatrixInitVal;
  MmadParams(uint16_t m_ = 0, uint16_t n_ = 0, uint16_t k_ = 0, bool init = true)
      : m(m_), n(n_), k(k_), isBias(false), fmOffset(0), enSsparse(false), enWinogradA(false), enWinogradB(false),
        unitFlag(0), kDirectionAlign(false), cmatrixSource(false), cmatrixInitVal(init) {}
};
// C (L0C, zN, float32) = (cmatrixInitVal ? 0 : C) + A (L0A, zZ) x B (L0B, nZ), on the cube (pipe M)
template <typename C, typename T> inline void Mmad(const LocalTensor<C>& c, const LocalTensor<T>& a, const LocalTensor<T>& b,
                                                  const MmadParams& p, int line = __builtin_LINE()) {
  using namespace tc_emu;
  check_align(a.scope, a.off, 512, "Mmad A", line);
  check_align(b.scope, b.off, 512, "Mmad B", line);
  check_align(c.scope, c.off, 64, "Mmad C", line);
  uint32_t mp = (p.m + 15u) / 16u * 16u, np = (p.n + 15u) / 16u * 16u, kp = (p.k + 15u) / 16u * 16u;
  uint64_t t = tick(PIPE_M, 8 + (double)mp * np * kp / 4096);  // one 16x16x16 fractal product a cycle
  access(a.scope, a.off, mp * kp * 2, PIPE_M, false, t, line);
  access(b.scope, b.off, kp * np * 2, PIPE_M, false, t, line);
  if (!p.cmatrixInitVal) access(c.scope, c.off, mp * np * 4, PIPE_M, false, t, line);
  access(c.scope, c.off, mp * np * 4, PIPE_M, true, t, line);
  for (uint32_t m = 0; m < p.m; ++m)
    for (uint32_t n = 0; n < p.n; ++n) {
      float acc = 0.0f;
      for (uint32_t k = 0; k < p.k; ++k) {
        float x = (float)a.data()[((m / 16) * (kp / 16) + k / 16) * 256 + (m % 16) * 16 + k % 16];
        float y = (float)b.data()[((k / 16) * (np / 16) + n / 16) * 256 + (n % 16) * 16 + k % 16];
        acc += x * y;
      }
      C& out = c.data()[((n / 16) * mp + m) * 16 + n % 16];
      out = (C)((p.cmatrixInitVal ? 0.0f : (float)out) + acc);
    }
}
enum class QuantMode_t { NoQuant, F322F16, F322BF16 };
struct FixpipeParamsV220 {
  uint16_t nSize, mSize, srcStride; uint32_t dstStride; QuantMode_t quantPre; uint8_t reluEn; uint16_t ndNum;
  FixpipeParamsV220(uint16_t n = 0, uint16_t m = 0, uint16_t ss = 0, uint32_t ds = 0, QuantMode_t q = QuantMode_t::NoQuant)
      : nSize(n), mSize(m), srcStride(ss), dstStride(ds), quantPre(q), reluEn(0), ndNum(1) {}
};
constexpr int CFG_ROW_MAJOR = 1;
// L0C (zN, srcStride rows per 16-column block) -> GM row-major (dstStride elements a row), on FIX
template <typename D, typename C, int CFG> inline void Fixpipe(const GlobalTensor<D>& dst, const LocalTensor<C>& src,
                                                              const FixpipeParamsV220& p, int line = __builtin_LINE()) {
  using namespace tc_emu;
  check_align(src.scope, src.off, 64, "Fixpipe source", line);
  uint64_t t = tick(PIPE_FIX, 32 + (double)p.mSize * p.nSize * 4 / 64);
  for (uint32_t m = 0; m < p.mSize; ++m)
    for (uint32_t n = 0; n < p.nSize; ++n) {
      uint32_t at = ((n / 16) * p.srcStride + m) * 16 + n % 16;
      access(src.scope, src.off + at * 4, 4, PIPE_FIX, false, t, line);
      ws_access(&dst.ptr[(uint64_t)m * p.dstStride + n], sizeof(D), true, line);
      dst.ptr[(uint64_t)m * p.dstStride + n] = (D)(float)src.data()[at];
    }
}
}  // namespace AscendC

// -- the host side of the emulation ---------------------------------------------------------------------
extern "C" {
// defined (not inline) in the one translation unit that includes this header: the runtime reads them
__attribute__((visibility("default"), used)) int tc_emu_findings() { return tc_emu::S().findings; }
__attribute__((visibility("default"), used)) const char* tc_emu_log() { return tc_emu::S().log; }
// the last launch's timing: out[0] the makespans of its cores added up, out[1] the sum of every instruction's cost
__attribute__((visibility("default"), used)) void tc_emu_cycles(double* out) { out[0] = tc_emu::S().makespan; out[1] = tc_emu::S().work; }
}
// one core of block `block`: the AIC (core_type 2) or AIV sub-block `sub` (core_type 1). On-chip memory and
// pipe clocks start fresh for each (the AIC owns L1/L0, the AIV its UB); the workspace stamps and the
// cross-core flags live for the whole block (reset by tc_emu_block)
inline void tc_emu_begin(int block, int nblocks, int core_type, int sub = 0, int ratio = 1) {
  tc_emu::State& s = tc_emu::S();
  s.block = block; s.nblocks = nblocks; s.core_type = core_type; s.sub = sub; s.ratio = ratio; s.ratio_of_group = ratio;
  tc_emu::reset_block();
  s.cross_known = 0;
}
inline void tc_emu_block() {
  tc_emu::State& s = tc_emu::S();
  std::memset(s.cross_count, 0, sizeof(s.cross_count));
}
inline void tc_emu_workspace(void* p, uint64_t bytes) {
  tc_emu::State& s = tc_emu::S();
  s.ws = (uint8_t*)p; s.ws_bytes = bytes;
  s.ws_stamp = (uint64_t*)std::calloc(bytes / 32 + 1, sizeof(uint64_t));
  s.cross_clk = 0;
}
inline void tc_emu_block_end() {
  tc_emu::State& s = tc_emu::S();
  for (int v = 0; v < 2; ++v)
    for (int id = 0; id < 16; ++id)
      if (s.cross_count[v][id])
        tc_emu::finding("unbalanced: CrossCoreSetFlag(%d) at line %d is never waited by AIV sub-block %d", id, s.cross_line[id], v);
}
inline void tc_emu_end() {
  using namespace tc_emu;
  State& s = S();
  double span = 0;
  for (int p = 0; p < NP; ++p) span = s.t[p] > span ? s.t[p] : span;
  s.makespan += span;
  for (int e = 0; e < 32; ++e)
    for (int id = 0; id < TC_EMU_EVENT_IDS; ++id)
      if (s.flag_count[e][id]) {
        int src, dst; event_pipes((AscendC::HardEvent)e, src, dst);
        finding("unbalanced: SetFlag<%s_%s>(%d) at line %d is never waited", PIPE_NAMES[src], PIPE_NAMES[dst], id,
                s.flag_line[e][id]);
      }
}
inline void tc_emu_reset_findings() { tc_emu::S().makespan = 0; tc_emu::S().work = 0; tc_emu::S().findings = 0; tc_emu::S().nsaid = 0; tc_emu::S().loglen = 0; tc_emu::S().log[0] = 0; }
