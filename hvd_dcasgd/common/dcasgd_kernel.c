/* The project's C kernels, each one pass over float32 arrays: the server's
 * DC-ASGD update (hvd_dcasgd_f32) and the worker's pack (hvd_pack_f32).
 *
 * The DC-ASGD update (see hvd_dcasgd/algorithm/dcasgd.py):
 *
 * For each element, with lambda_t = lambda_0, or, when mean_square is given,
 * MeanSquare = m * MeanSquare + (1 - m) * g * g and
 * lambda_t = lambda_0 / sqrt(MeanSquare + eps):
 *
 *     c   = lambda_t * g * g * (w - w_bak)
 *     g_c = g + clamp(c, -bound * |g|, bound * |g|)
 *
 * bound = +inf leaves c as it is (the paper's formula): bound * |g| is then
 * +inf, or NaN where g is 0, and neither comparison below holds, so the
 * variants without the clamp (_unbounded) run instead: the same result,
 * without the clamp's arithmetic (about a third of the update's time on
 * 1M elements in cache).
 * With sgd_step set, torch.optim.SGD's step with g_c follows -- weight decay,
 * then momentum when momentum_buffer is given (buf = carry * buf + undamped * d:
 * the caller passes carry = 0 and undamped = 1 on the first step, which starts
 * the buffer from d), Nesterov or not, then w -= lr * d -- and w_bak = w; grad
 * is left as it is.  Otherwise grad becomes g_c.
 * Each operation rounds as torch's reference implementation does (no
 * contraction into FMA, 1/sqrt then a product), so g_c is bit-identical to it.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PARAMETERS                                                                                    \
    float *restrict grad, float *restrict w, float *restrict w_bak, float *restrict mean_square,         \
    float *restrict momentum_buffer, int64_t n,                                                         \
    float lambda_0, float keep, float blend, float eps, float bound, float lr, float weight_decay,      \
    float momentum, float carry, float undamped, int threads

/* Blocks of BLOCK elements.  At the start of each, the next block's lines of
 * w_bak are asked for: with the intent to write them (PREFETCHW where the CPU
 * has it) when the update writes them.  w_bak(m) is worker m's outbox, last
 * read by that worker's Get on another core, so a store to it (or a load,
 * then a store) waits for that core to give the line up; asking a block early
 * overlaps those waits with this block's work.  Beside its memory traffic the
 * update's arithmetic costs nothing measurable, so the traffic is what is
 * arranged. */
#define BLOCK 1024

/* One function per structural variant, so that each is a straight loop that
 * the compiler vectorises (an OpenMP region is outlined once per function). */
#define DEFINE_UPDATE(NAME, PLAIN, BOUNDED, ADAPTIVE, SGD_STEP, WITH_MOMENTUM, NESTEROV)              \
    static void NAME(PARAMETERS)                                                                     \
    {                                                                                                \
        _Pragma("omp parallel for schedule(static) num_threads(threads) if (n > 65536)")            \
        for (int64_t block = 0; block < n; block += BLOCK) {                                         \
            const int64_t end = n - block < BLOCK ? n : block + BLOCK;                               \
            for (int64_t j = end; j < n && j < end + BLOCK; j += 64 / sizeof(float))                 \
                __builtin_prefetch(&w_bak[j], SGD_STEP, 3);                                         \
            _Pragma("omp simd")                                                                      \
            for (int64_t i = block; i < end; i++)                                                    \
                UPDATE_ONE(PLAIN, BOUNDED, ADAPTIVE, SGD_STEP, WITH_MOMENTUM, NESTEROV)               \
        }                                                                                            \
    }

/* The update of element i. */
#define UPDATE_ONE(PLAIN, BOUNDED, ADAPTIVE, SGD_STEP, WITH_MOMENTUM, NESTEROV)                       \
        {                                                                                            \
            const float g = grad[i];                                                                 \
            float lambda_t = lambda_0;                                                               \
            if (ADAPTIVE) {                                                                          \
                const float v = mean_square[i] * keep + (blend * g) * g;                             \
                mean_square[i] = v;                                                                  \
                lambda_t = (1.0f / sqrtf(v + eps)) * lambda_0;                                       \
            }                                                                                        \
            float compensated = g;                                                                   \
            if (!(PLAIN)) {                                                                          \
                const float c = lambda_t * g * g * (w[i] - w_bak[i]);                                \
                if (BOUNDED) {                                                                       \
                    const float lim = bound * fabsf(g);                                              \
                    compensated = g + (c > lim ? lim : c < -lim ? -lim : c);                         \
                } else {                                                                             \
                    compensated = g + c;                                                             \
                }                                                                                    \
            }                                                                                        \
            if (!(SGD_STEP)) {                                                                       \
                grad[i] = compensated;                                                               \
            } else {                                                                                 \
                float d = compensated + weight_decay * w[i]; /* exact when weight_decay is 0 */      \
                if (WITH_MOMENTUM) {                                                                 \
                    const float buf = momentum_buffer[i] * carry + undamped * d;                     \
                    momentum_buffer[i] = buf;                                                        \
                    d = (NESTEROV) ? d + momentum * buf : buf;                                       \
                }                                                                                    \
                const float updated = w[i] - lr * d;                                                 \
                w[i] = updated;                                                                      \
                w_bak[i] = updated;                                                                  \
            }                                                                                        \
        }

/* PLAIN: lambda_0 is 0 (ASGD), so the gradient is used as it came and w_bak is
 * only written, never read: one stream of memory less. */
/* Each compensating variant twice: with the clamp (a finite bound) and
 * without it (_unbounded: bound = +inf, the paper's formula). */
#define DEFINE_COMPENSATING(NAME, ADAPTIVE, SGD_STEP, WITH_MOMENTUM, NESTEROV)                        \
    DEFINE_UPDATE(NAME, 0, 1, ADAPTIVE, SGD_STEP, WITH_MOMENTUM, NESTEROV)                             \
    DEFINE_UPDATE(NAME##_unbounded, 0, 0, ADAPTIVE, SGD_STEP, WITH_MOMENTUM, NESTEROV)

DEFINE_COMPENSATING(compensate_constant, 0, 0, 0, 0)
DEFINE_COMPENSATING(compensate_adaptive, 1, 0, 0, 0)
DEFINE_UPDATE(step_plain, 1, 0, 0, 1, 0, 0)
DEFINE_COMPENSATING(step_constant, 0, 1, 0, 0)
DEFINE_COMPENSATING(step_adaptive, 1, 1, 0, 0)
DEFINE_UPDATE(momentum_step_plain, 1, 0, 0, 1, 1, 0)
DEFINE_COMPENSATING(momentum_step_constant, 0, 1, 1, 0)
DEFINE_COMPENSATING(momentum_step_adaptive, 1, 1, 1, 0)
DEFINE_UPDATE(nesterov_step_plain, 1, 0, 0, 1, 1, 1)
DEFINE_COMPENSATING(nesterov_step_constant, 0, 1, 1, 1)
DEFINE_COMPENSATING(nesterov_step_adaptive, 1, 1, 1, 1)

void hvd_dcasgd_f32(PARAMETERS, int nesterov, int sgd_step)
{
    /* keep = m, blend = 1 - m and undamped = 1 - dampening, each rounded to float32 by the caller */
    void (*variant)(PARAMETERS);
    const int adaptive = mean_square != NULL;
    const int plain = !adaptive && lambda_0 == 0.0f;
    const int bounded = !(isinf(bound) && bound > 0);
#define BOUNDED_OR_NOT(NAME) (bounded ? NAME : NAME##_unbounded)
    if (!sgd_step)
        variant = adaptive ? BOUNDED_OR_NOT(compensate_adaptive) : BOUNDED_OR_NOT(compensate_constant);
    else if (momentum_buffer == NULL)
        variant = adaptive ? BOUNDED_OR_NOT(step_adaptive) : plain ? step_plain : BOUNDED_OR_NOT(step_constant);
    else if (!nesterov)
        variant = adaptive ? BOUNDED_OR_NOT(momentum_step_adaptive)
                  : plain ? momentum_step_plain : BOUNDED_OR_NOT(momentum_step_constant);
    else
        variant = adaptive ? BOUNDED_OR_NOT(nesterov_step_adaptive)
                  : plain ? nesterov_step_plain : BOUNDED_OR_NOT(nesterov_step_constant);
#undef BOUNDED_OR_NOT
    variant(grad, w, w_bak, mean_square, momentum_buffer, n, lambda_0, keep, blend, eps, bound, lr, weight_decay,
            momentum, carry, undamped, threads);
}

/* The worker's pack: copy a float32 gradient into the push message and, with
 * check set, find whether any element is NaN or Inf (all exponent bits set) in
 * the same pass, where a copy and then a test read the gradient twice.
 * Returns 1 when one is, 0 otherwise (always 0 without check). */
int hvd_pack_f32(const float *restrict src, float *restrict dst, int64_t n, int check, int threads)
{
    int bad = 0;
    if (!check) {
        _Pragma("omp parallel for simd schedule(static) num_threads(threads) if (n > 65536)")
        for (int64_t i = 0; i < n; i++)
            dst[i] = src[i];
        return 0;
    }
    _Pragma("omp parallel for simd schedule(static) num_threads(threads) if (n > 65536) reduction(|:bad)")
    for (int64_t i = 0; i < n; i++) {
        const float v = src[i];
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        dst[i] = v;
        bad |= (bits & 0x7f800000u) == 0x7f800000u;
    }
    return bad;
}
