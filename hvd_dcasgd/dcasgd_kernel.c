/* The DC-ASGD update in one pass over float32 arrays (see compensation.py).
 *
 * For each element, with lambda_t = lambda_0, or, when mean_square is given,
 * MeanSquare = m * MeanSquare + (1 - m) * g * g and
 * lambda_t = lambda_0 / sqrt(MeanSquare + eps):
 *
 *     g_c = g + lambda_t * g * g * (w - w_bak)
 *
 * With sgd_step set, the plain-SGD server update follows -- w -= lr * g_c,
 * w_bak = w -- and grad is left as it is; otherwise grad becomes g_c.
 * Each operation rounds as torch's reference implementation does (no
 * contraction into FMA, 1/sqrt then a product), so g_c is bit-identical to it.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

void hvd_dcasgd_f32(float *grad, float *w, float *w_bak, float *mean_square, int64_t n,
                    float lambda_0, float keep, float blend, float eps, float lr, int sgd_step, int threads)
{
    /* keep = m and blend = 1 - m, each rounded to float32 by the caller */
#pragma omp parallel for simd schedule(static) num_threads(threads) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        const float g = grad[i];
        float lambda_t = lambda_0;
        if (mean_square != NULL) {
            const float v = mean_square[i] * keep + (blend * g) * g;
            mean_square[i] = v;
            lambda_t = (1.0f / sqrtf(v + eps)) * lambda_0;
        }
        const float compensated = g + lambda_t * g * g * (w[i] - w_bak[i]);
        if (sgd_step) {
            const float updated = w[i] - lr * compensated;
            w[i] = updated;
            w_bak[i] = updated;
        } else {
            grad[i] = compensated;
        }
    }
}
