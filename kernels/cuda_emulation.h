// minitensor's CUDA emulation prelude: what a simple CUDA C++ source needs to compile with the host C++ compiler
// and run on the simulated device, where device memory is host memory. Force-included before the source (and the
// fake cuda_runtime.h / cuda.h include it). A launch runs the grid's blocks one after another, and each block's
// threads one after another (z, y, x; x fastest), on the calling host thread: exactly the GPU's results for
// kernels whose threads do not talk to each other. minitensor refuses, before compiling, sources using shared
// memory, barriers or warp-level operations (cuda_emulation.py). Sequential threads make atomics trivially
// correct; they are real atomics anyway, as two simulated streams may run kernels at once on two host threads.
#pragma once

#include <assert.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <utility>

#define __CUDACC__ 1
#define MINITENSOR_CUDA_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __grid_constant__
// empty, not `inline`: sources also write `inline __forceinline__`, a duplicate `inline` for GCC
#define __forceinline__
#define __launch_bounds__(...)
#define __maxnreg__(...)
#define __align__(n) __attribute__((aligned(n)))
// __noinline__ is rewritten in the source instead: libstdc++ spells __attribute__((__noinline__)) itself.

// ------------------------------------------------------------------------------------------------ geometry
struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
// One set per host thread: two simulated streams may run kernels at once.
static thread_local uint3 threadIdx, blockIdx;
static thread_local dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

#define MT_VECTOR2(T, N, A) struct __attribute__((aligned(A))) N##2 { T x, y; }; \
  inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define MT_VECTOR4(T, N, A) struct __attribute__((aligned(A))) N##4 { T x, y, z, w; }; \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
MT_VECTOR2(float, float, 8) MT_VECTOR4(float, float, 16) MT_VECTOR2(int, int, 8) MT_VECTOR4(int, int, 16)
MT_VECTOR2(unsigned, uint, 8) MT_VECTOR4(unsigned, uint, 16) MT_VECTOR2(double, double, 16)
MT_VECTOR2(long long, longlong, 16)
struct float3 { float x, y, z; };
inline float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }
#undef MT_VECTOR2
#undef MT_VECTOR4

// ------------------------------------------------------------------------------------------------ device math
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline void __sincosf(float x, float *s, float *c) { *s = sinf(x); *c = cosf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __frsqrt_rn(float a) { return 1.0f / sqrtf(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }

#define MT_MINMAX(R, A, B) inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; } \
  inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
MT_MINMAX(int, int, int) MT_MINMAX(unsigned, unsigned, unsigned) MT_MINMAX(unsigned, int, unsigned)
MT_MINMAX(unsigned, unsigned, int) MT_MINMAX(long, long, long) MT_MINMAX(unsigned long, unsigned long, unsigned long)
MT_MINMAX(long long, long long, long long)
MT_MINMAX(unsigned long long, unsigned long long, unsigned long long)
MT_MINMAX(unsigned long long, long long, unsigned long long)
MT_MINMAX(unsigned long long, unsigned long long, long long)
#undef MT_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(a, b); }
inline double max(float a, double b) { return fmax(a, b); }
inline double min(double a, float b) { return fmin(a, b); }
inline double max(double a, float b) { return fmax(a, b); }

template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }
template <class T> inline T __ldcs(const T *p) { return *p; }
template <class T> inline void __stcg(T *p, T v) { *p = v; }
template <class T> inline void __stcs(T *p, T v) { *p = v; }

inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)floorf(x); }
inline int __float2int_ru(float x) { return (int)ceilf(x); }
inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
inline unsigned __float2uint_rz(float x) { return (unsigned)x; }
inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
inline long long __float2ll_rz(float x) { return (long long)x; }
inline int __double2int_rn(double x) { return (int)nearbyint(x); }
inline int __double2int_rz(double x) { return (int)x; }
inline float __double2float_rn(double x) { return (float)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline double __int2double_rn(int x) { return (double)x; }

namespace __mt_emu {
template <class To, class From> inline To bits(From v) { To r; memcpy(&r, &v, sizeof r); return r; }
}
inline int __float_as_int(float x) { return __mt_emu::bits<int>(x); }
inline unsigned __float_as_uint(float x) { return __mt_emu::bits<unsigned>(x); }
inline float __int_as_float(int x) { return __mt_emu::bits<float>(x); }
inline float __uint_as_float(unsigned x) { return __mt_emu::bits<float>(x); }
inline long long __double_as_longlong(double x) { return __mt_emu::bits<long long>(x); }
inline double __longlong_as_double(long long x) { return __mt_emu::bits<double>(x); }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

// ------------------------------------------------------------------------------------------------ atomics
// Relaxed, as CUDA's are; the overloads CUDA declares (CUDA C++ Programming Guide, "Atomic Functions").
namespace __mt_emu {
template <class T, class F> inline T update(T *address, F f) {
  T old, want;
  __atomic_load(address, &old, __ATOMIC_RELAXED);
  do {
    want = f(old);
  } while (!__atomic_compare_exchange(address, &old, &want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
}
}  // namespace __mt_emu

#define MT_ATOMIC_BITS(T) \
  inline T atomicAdd(T *a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); } \
  inline T atomicExch(T *a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); } \
  inline T atomicMin(T *a, T v) { return __mt_emu::update(a, [v](T o) { return v < o ? v : o; }); } \
  inline T atomicMax(T *a, T v) { return __mt_emu::update(a, [v](T o) { return v > o ? v : o; }); } \
  inline T atomicAnd(T *a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); } \
  inline T atomicOr(T *a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); } \
  inline T atomicXor(T *a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); } \
  inline T atomicCAS(T *a, T compare, T v) { \
    __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); \
    return compare; \
  }
MT_ATOMIC_BITS(int)
MT_ATOMIC_BITS(unsigned)
MT_ATOMIC_BITS(unsigned long long)
#undef MT_ATOMIC_BITS
inline int atomicSub(int *a, int v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicSub(unsigned *a, unsigned v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
inline long long atomicMin(long long *a, long long v) {
  return __mt_emu::update(a, [v](long long o) { return v < o ? v : o; });
}
inline long long atomicMax(long long *a, long long v) {
  return __mt_emu::update(a, [v](long long o) { return v > o ? v : o; });
}
inline float atomicAdd(float *a, float v) { return __mt_emu::update(a, [v](float o) { return o + v; }); }
inline double atomicAdd(double *a, double v) { return __mt_emu::update(a, [v](double o) { return o + v; }); }
inline float atomicExch(float *a, float v) { return __mt_emu::update(a, [v](float) { return v; }); }
inline unsigned atomicInc(unsigned *a, unsigned v) {
  return __mt_emu::update(a, [v](unsigned o) { return o >= v ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned *a, unsigned v) {
  return __mt_emu::update(a, [v](unsigned o) { return (o == 0 || o > v) ? v : o - 1; });
}
// The scoped variants: with one thread at a time, every scope is the same.
#define MT_SCOPED(name) \
  template <class T, class... A> inline auto name##_block(T *a, A... v) { return name(a, v...); } \
  template <class T, class... A> inline auto name##_system(T *a, A... v) { return name(a, v...); }
MT_SCOPED(atomicAdd) MT_SCOPED(atomicSub) MT_SCOPED(atomicExch) MT_SCOPED(atomicMin) MT_SCOPED(atomicMax)
MT_SCOPED(atomicAnd) MT_SCOPED(atomicOr) MT_SCOPED(atomicXor) MT_SCOPED(atomicCAS) MT_SCOPED(atomicInc)
MT_SCOPED(atomicDec)
#undef MT_SCOPED
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() {}
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ------------------------------------------------------------------------------------------------ host runtime
enum cudaError { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
typedef enum cudaError cudaError_t;
typedef struct CUstream_st *cudaStream_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
namespace __mt_emu {
static thread_local cudaError_t last_error = cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
  cudaError_t e = __mt_emu::last_error;
  __mt_emu::last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return __mt_emu::last_error; }
inline const char *cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess"
         : e == cudaErrorInvalidValue ? "cudaErrorInvalidValue"
         : e == cudaErrorInvalidConfiguration ? "cudaErrorInvalidConfiguration" : "cudaErrorUnknown";
}
inline const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error"
         : e == cudaErrorInvalidValue ? "invalid argument"
         : e == cudaErrorInvalidConfiguration ? "invalid configuration argument" : "unknown error";
}
// Launches run at once on the calling thread, so there is never anything to wait for.
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
// Device memory is host memory on the simulated device.
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind) {
  memmove(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t = 0) {
  return cudaMemcpy(dst, src, n, k);
}
inline cudaError_t cudaMemset(void *dst, int value, size_t n) {
  memset(dst, value, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t = 0) {
  return cudaMemset(dst, value, n);
}

// ------------------------------------------------------------------------------------------------ launches
namespace __mt_emu {
// Run `body` once per thread of the grid: blocks and the threads of a block in z, y, x order, x fastest.
template <class F> inline void grid(dim3 g, dim3 b, F &&body) {
  gridDim = g;
  blockDim = b;
  for (unsigned bz = 0; bz < g.z; ++bz)
    for (unsigned by = 0; by < g.y; ++by)
      for (unsigned bx = 0; bx < g.x; ++bx) {
        blockIdx = uint3{bx, by, bz};
        for (unsigned tz = 0; tz < b.z; ++tz)
          for (unsigned ty = 0; ty < b.y; ++ty)
            for (unsigned tx = 0; tx < b.x; ++tx) {
              threadIdx = uint3{tx, ty, tz};
              body();
            }
      }
}

inline bool valid(dim3 g, dim3 b) {
  return g.x >= 1 && g.y >= 1 && g.z >= 1 && g.x <= 2147483647u && g.y <= 65535 && g.z <= 65535 && b.x >= 1 &&
         b.y >= 1 && b.z >= 1 && b.x <= 1024 && b.y <= 1024 && b.z <= 64 &&
         (unsigned long long)b.x * b.y * b.z <= 1024;
}

// `k<<<g, b, shared, stream>>>(args)` is rewritten to `__mt_emu::launch(<call of k>, g, b, shared, stream)(args)`;
// a bad configuration is reported as CUDA does: by cudaGetLastError, with nothing run.
template <class Call> struct Launch {
  Call call;
  dim3 g, b;
  template <class... A> void operator()(A &&...args) const {
    if (valid(g, b)) grid(g, b, [&] { call(args...); });
  }
};
template <class Call>
inline Launch<Call> launch(Call call, dim3 g, dim3 b, size_t shared = 0, cudaStream_t stream = 0) {
  (void)shared;
  (void)stream;
  if (!valid(g, b)) last_error = cudaErrorInvalidConfiguration;
  return Launch<Call>{call, g, b};
}

// The entry points minitensor generates for Python: arguments arrive as `void *args[]`, one per parameter, and
// the grid as {gx, gy, gz, bx, by, bz}, already checked against CUDA's limits.
template <class Kernel> struct Packed;
template <class... P> struct Packed<void (*)(P...)> {
  template <void (*K)(P...)> static void run(const unsigned *dims, void **args) {
    run<K>(dims, args, std::index_sequence_for<P...>{});
  }
  template <void (*K)(P...), size_t... I> static void run(const unsigned *d, void **args, std::index_sequence<I...>) {
    std::tuple<std::decay_t<P>...> values{*static_cast<std::decay_t<P> *>(args[I])...};
    (void)args;
    grid(dim3(d[0], d[1], d[2]), dim3(d[3], d[4], d[5]), [&] { K(std::get<I>(values)...); });
  }
};
}  // namespace __mt_emu
