/* Native CPU kernels for measuring what a fused dropout could cost on this machine.

   Not part of the library: benchmarks/bench_native.py compiles this file, loads it
   with ctypes and times it beside XLA. Every kernel works in place on a buffer of
   n elements (n a multiple of 256) and repeats `passes` times, so that the time per
   pass has no per-call cost in it. Threads: OpenMP over blocks of 8 words.

   Mask layout (the same as dropmask's impl="fast", checked bit for bit by the
   benchmark for Threefry-4x32-20): word w holds elements 32w..32w+31; its calls
   j = 0..3 use counter (w, j, 0, 0); lane l = 8j + 2o + h reads bits 16h..16h+15 of
   output word o, and is kept when that 16-bit field is below `thr`.

   Generators (argument `gen`):
     0  Threefry-4x32-20 (Salmon et al., SC 2011; dropmask's generator)
     1  Threefry-4x32-13 (Random123's lowest round count without known flaws is 12)
     2  Philox-4x32-10   (same paper; 32x32->64 multiplies)
     3  ARS-5            (same paper; 5 AES rounds: AES-NI, on 256-bit VAES where present)
     4  ARS-7            (Random123's default round count for ARS)
*/
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef uint32_t v8u __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));

#define ROTL(x, r) (((x) << (r)) | ((x) >> (32 - (r))))

static const int kRot[8][2] = {{10, 26}, {11, 21}, {13, 27}, {23, 5},
                               {6, 20},  {17, 11}, {25, 10}, {18, 20}};

/* Threefry-4x32 on two independent sets of 8 counters at once. For 2**21 calls on this
   machine's 2 cores: 4.2-4.8 ms with two sets, 5.1-5.4 ms with one (too little
   independent work per round), 5.3-5.5 ms with four (register spills). */
static inline __attribute__((always_inline)) void threefry2(v8u x[2][4], const uint32_t ks[5],
                                                              int rounds) {
  for (int q = 0; q < 2; q++)
    for (int i = 0; i < 4; i++) x[q][i] += ks[i];
#pragma GCC unroll 20
  for (int r = 0; r < 20; r++) {
    if (r >= rounds) break;
    int a = kRot[r % 8][0], b = kRot[r % 8][1];
    for (int q = 0; q < 2; q++) {
      v8u *y = x[q];
      if (r % 2 == 0) {
        y[0] += y[1]; y[1] = ROTL(y[1], a) ^ y[0];
        y[2] += y[3]; y[3] = ROTL(y[3], b) ^ y[2];
      } else {
        y[0] += y[3]; y[3] = ROTL(y[3], a) ^ y[0];
        y[2] += y[1]; y[1] = ROTL(y[1], b) ^ y[2];
      }
      if (r % 4 == 3) {
        int s = r / 4 + 1;
        for (int i = 0; i < 4; i++) y[i] += ks[(s + i) % 5];
        y[3] += (uint32_t)s;
      }
    }
  }
}

/* hi and lo halves of the 32x32->64 products a * m, lane by lane. */
static inline __attribute__((always_inline)) void mulhilo(v8u a, uint32_t m, v8u *hi, v8u *lo) {
  __m256i va = (__m256i)a, vm = _mm256_set1_epi32((int)m);
  __m256i even = _mm256_mul_epu32(va, vm);
  __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(va, 32), vm);
  *lo = (v8u)_mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = (v8u)_mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

static inline __attribute__((always_inline)) void philox2(v8u x[2][4], const uint32_t ks[5]) {
  uint32_t k0 = ks[0], k1 = ks[1];
#pragma GCC unroll 10
  for (int r = 0; r < 10; r++) {
    for (int q = 0; q < 2; q++) {
      v8u *y = x[q], hi0, lo0, hi1, lo1;
      mulhilo(y[0], 0xD2511F53u, &hi0, &lo0);
      mulhilo(y[2], 0xCD9E8D57u, &hi1, &lo1);
      v8u n0 = hi1 ^ y[1] ^ k0, n2 = hi0 ^ y[3] ^ k1;
      y[0] = n0; y[1] = lo1; y[2] = n2; y[3] = lo0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

/* Keep-flags of words w..w+7 from a 4x32 generator `G` applied to counters (w+i, j, 0, 0):
   lane 8j + 2o + h is field h of output word o. */
#define WORDS8_4X32(NAME, G)                                                              \
  static inline __attribute__((always_inline)) v8u NAME(const uint32_t ks[5], uint32_t w, \
                                                        uint32_t thr) {                  \
    v8u packed = {0}, index = {0, 1, 2, 3, 4, 5, 6, 7};                                  \
    index += w;                                                                          \
    for (uint32_t j0 = 0; j0 < 4; j0 += 2) {                                             \
      v8u x[2][4];                                                                       \
      for (int q = 0; q < 2; q++) {                                                      \
        x[q][0] = index;                                                                 \
        x[q][1] = (v8u){0} + (j0 + q);                                                   \
        x[q][2] = x[q][3] = (v8u){0};                                                    \
      }                                                                                  \
      G;                                                                                 \
      for (int q = 0; q < 2; q++)                                                        \
        for (int o = 0; o < 4; o++) {                                                    \
          int lane = 8 * (j0 + q) + 2 * o;                                               \
          v8u low = (v8u)((x[q][o] & 0xFFFFu) < thr) & 1u;                               \
          v8u high = (v8u)((x[q][o] >> 16) < thr) & 1u;                                  \
          packed |= low << lane | high << (lane + 1);                                    \
        }                                                                                \
    }                                                                                    \
    return packed;                                                                       \
  }

WORDS8_4X32(words8_threefry20, threefry2(x, ks, 20))
WORDS8_4X32(words8_threefry13, threefry2(x, ks, 13))
WORDS8_4X32(words8_philox10, philox2(x, ks))

/* ARS in AES's own layout: one 128-bit block per (word, call); its eight 16-bit fields
   are compared at once and their flags gathered with movemask and pext. */
static inline __attribute__((always_inline)) uint32_t ars_flags(__m128i block, uint32_t thr) {
  const __m128i bias = _mm_set1_epi16((short)0x8000);
  __m128i lt = _mm_cmplt_epi16(_mm_xor_si128(block, bias),
                               _mm_xor_si128(_mm_set1_epi16((short)thr), bias));
  return _pext_u32((uint32_t)_mm_movemask_epi8(lt), 0x5555u);
}

typedef struct {
  __m256i rk[8]; /* round keys for up to 7 rounds */
} ArsKey;

static ArsKey ars_key(const uint32_t key[4]) {
  ArsKey k;
  uint64_t lo = (uint64_t)key[0] | (uint64_t)key[1] << 32;
  uint64_t hi = (uint64_t)key[2] | (uint64_t)key[3] << 32;
  for (int i = 0; i < 8; i++) { /* k_{i+1} = k_i + Weyl constants, per 64-bit half */
    k.rk[i] = _mm256_set_epi64x((long long)hi, (long long)lo, (long long)hi, (long long)lo);
    lo += 0x9E3779B97F4A7C15ull;
    hi += 0xBB67AE8584CAA73Bull;
  }
  return k;
}

static inline __attribute__((always_inline)) v8u words8_ars(const ArsKey *k, uint32_t w,
                                                            uint32_t thr, int rounds) {
  uint32_t flags[8];
  for (int i = 0; i < 8; i++) {
    uint32_t word = 0;
    for (int j = 0; j < 4; j += 2) { /* calls j and j + 1 */
      __m256i v = _mm256_setr_epi32((int)(w + i), j, 0, 0, (int)(w + i), j + 1, 0, 0);
      v = _mm256_xor_si256(v, k->rk[0]);
#ifdef NO_VAES
      __m128i a = _mm256_castsi256_si128(v), b = _mm256_extracti128_si256(v, 1);
      for (int r = 1; r < rounds; r++) {
        a = _mm_aesenc_si128(a, _mm256_castsi256_si128(k->rk[r]));
        b = _mm_aesenc_si128(b, _mm256_castsi256_si128(k->rk[r]));
      }
      a = _mm_aesenclast_si128(a, _mm256_castsi256_si128(k->rk[rounds]));
      b = _mm_aesenclast_si128(b, _mm256_castsi256_si128(k->rk[rounds]));
#else
      for (int r = 1; r < rounds; r++) v = _mm256_aesenc_epi128(v, k->rk[r]);
      v = _mm256_aesenclast_epi128(v, k->rk[rounds]);
      __m128i a = _mm256_castsi256_si128(v), b = _mm256_extracti128_si256(v, 1);
#endif
      word |= ars_flags(a, thr) << (8 * j) | ars_flags(b, thr) << (8 * j + 8);
    }
    flags[i] = word;
  }
  v8u packed;
  memcpy(&packed, flags, sizeof packed);
  return packed;
}

static const v8u kBit0 = {1u, 2u, 4u, 8u, 16u, 32u, 64u, 128u};

/* bf16 <-> f32 on 8 lanes; round to nearest even (inputs here are finite). */
static inline v8f bf16_to_f32(const uint16_t *p) {
  __m128i h;
  memcpy(&h, p, sizeof h);
  return (v8f)_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
}

static inline void f32_to_bf16(v8u bits, uint16_t *p) {
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  __m256i s = _mm256_srli_epi32((__m256i)bits, 16);
  __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  memcpy(p, &packed, sizeof packed);
}

/* 32 elements of word flags applied in place: x * scale where kept, 0 where dropped. */
static inline __attribute__((always_inline)) void apply_f32(float *xs, uint32_t flags,
                                                            float scale) {
  v8u m = (v8u){0} + flags;
  for (int l = 0; l < 32; l += 8) {
    v8u keep = (v8u)((m & (kBit0 << l)) != 0);
    v8f v;
    memcpy(&v, xs + l, sizeof v);
    v8u r = (v8u)(v * scale) & keep;
    memcpy(xs + l, &r, sizeof r);
  }
}

static inline __attribute__((always_inline)) void apply_bf16(uint16_t *xs, uint32_t flags,
                                                             float scale) {
  v8u m = (v8u){0} + flags;
  for (int l = 0; l < 32; l += 8) {
    v8u keep = (v8u)((m & (kBit0 << l)) != 0);
    f32_to_bf16((v8u)(bf16_to_f32(xs + l) * scale) & keep, xs + l);
  }
}

/* Asks for the cache lines that the iteration PREFETCH_DISTANCE steps ahead will read and
   write, so that memory streams while the generator computes. */
#ifndef PREFETCH_DISTANCE
#define PREFETCH_DISTANCE 4
#endif
static inline __attribute__((always_inline)) void prefetch_ahead(const void *here, size_t step) {
  const char *p = (const char *)here + PREFETCH_DISTANCE * step;
  for (size_t i = 0; i < step; i += 64) __builtin_prefetch(p + i, 1, 3);
}

/* Fused dropout of type T for one generator, applied with APPLY. */
#define DROPOUT_KERNEL(NAME, T, APPLY, KEY_TYPE, MAKE_KEY, WORDS8, KEY_ARG)               \
  static void NAME(const uint32_t *key, T *x, int64_t n, uint32_t thr, float scale) {     \
    KEY_TYPE k = MAKE_KEY(key);                                                           \
    _Pragma("omp parallel for schedule(static)") for (int64_t w = 0; w < n / 32; w += 8) { \
      prefetch_ahead(x + w * 32, sizeof(*x) * 256);                                       \
      v8u packed = WORDS8(KEY_ARG, (uint32_t)w, thr);                                     \
      for (int q = 0; q < 8; q++) APPLY(x + (w + q) * 32, packed[q], scale);              \
    }                                                                                     \
  }

/* For one generator: the packed words alone, and fused dropout in f32 and bf16. `KEY`
   is the generator's key state, built once per pass from `key`. */
#define KERNELS(NAME, KEY_TYPE, MAKE_KEY, WORDS8, KEY_ARG)                                \
  static void packed_words_##NAME(const uint32_t *key, uint32_t *out, int64_t n_words,    \
                                  uint32_t thr) {                                         \
    KEY_TYPE k = MAKE_KEY(key);                                                           \
    _Pragma("omp parallel for schedule(static)") for (int64_t w = 0; w < n_words; w += 8) { \
      v8u packed = WORDS8(KEY_ARG, (uint32_t)w, thr);                                     \
      memcpy(out + w, &packed, sizeof packed);                                            \
    }                                                                                     \
  }                                                                                       \
  DROPOUT_KERNEL(dropout_f32_##NAME, float, apply_f32, KEY_TYPE, MAKE_KEY, WORDS8, KEY_ARG) \
  DROPOUT_KERNEL(dropout_bf16_##NAME, uint16_t, apply_bf16, KEY_TYPE, MAKE_KEY, WORDS8, KEY_ARG)

typedef struct {
  uint32_t ks[5];
} Schedule;

static Schedule threefry_key(const uint32_t key[4]) {
  Schedule s = {{key[0], key[1], key[2], key[3], 0x1BD11BDAu ^ key[0] ^ key[1] ^ key[2] ^ key[3]}};
  return s;
}

KERNELS(threefry20, Schedule, threefry_key, words8_threefry20, k.ks)
KERNELS(threefry13, Schedule, threefry_key, words8_threefry13, k.ks)
KERNELS(philox10, Schedule, threefry_key, words8_philox10, k.ks) /* uses key[0..1] */
#define words8_ars5(k, w, thr) words8_ars(k, w, thr, 5)
#define words8_ars7(k, w, thr) words8_ars(k, w, thr, 7)
KERNELS(ars5, ArsKey, ars_key, words8_ars5, &k)
KERNELS(ars7, ArsKey, ars_key, words8_ars7, &k)

#define DISPATCH(KERNEL, ...)                                   \
  switch (gen) {                                                \
    case 0: KERNEL##_threefry20(__VA_ARGS__); break;            \
    case 1: KERNEL##_threefry13(__VA_ARGS__); break;            \
    case 2: KERNEL##_philox10(__VA_ARGS__); break;              \
    case 3: KERNEL##_ars5(__VA_ARGS__); break;                  \
    default: KERNEL##_ars7(__VA_ARGS__); break;                 \
  }

void packed_words(int gen, const uint32_t *key, uint32_t *out, int64_t n_words, uint32_t thr,
                  int passes) {
  for (int p = 0; p < passes; p++) DISPATCH(packed_words, key, out, n_words, thr)
}

void dropout_f32(int gen, const uint32_t *key, float *x, int64_t n, uint32_t thr, float scale,
                 int passes) {
  for (int p = 0; p < passes; p++) DISPATCH(dropout_f32, key, x, n, thr, scale)
}

void dropout_bf16(int gen, const uint32_t *key, uint16_t *x, int64_t n, uint32_t thr,
                  float scale, int passes) {
  for (int p = 0; p < passes; p++) DISPATCH(dropout_bf16, key, x, n, thr, scale)
}

void scale_f32(float *x, int64_t n, float c, int passes) {
  for (int p = 0; p < passes; p++) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += 8) {
      v8f v;
      memcpy(&v, x + i, sizeof v);
      v *= c;
      memcpy(x + i, &v, sizeof v);
    }
  }
}

void scale_bf16(uint16_t *x, int64_t n, float c, int passes) {
  for (int p = 0; p < passes; p++) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += 8) f32_to_bf16((v8u)(bf16_to_f32(x + i) * c), x + i);
  }
}
