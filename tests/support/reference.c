/* The float64 attention reference every decode path is checked against.
 * Written plainly, two passes, no tricks. */
#include <math.h>

#include "support.h"

void ikvt_ref_attention(const double *q, const double *k, const double *v, size_t n, size_t d, double scale,
                        double softcap, double *out, double *lse) {
    for (size_t j = 0; j < d; ++j) out[j] = 0.0;
    if (n == 0) {
        *lse = -INFINITY;
        return;
    }
    double mx = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
        double s = 0.0;
        for (size_t j = 0; j < d; ++j) s += q[j] * k[i * d + j];
        s *= scale;
        if (softcap > 0.0) s = softcap * tanh(s / softcap);
        if (s > mx) mx = s;
    }
    double den = 0.0;
    for (size_t i = 0; i < n; ++i) {
        double s = 0.0;
        for (size_t j = 0; j < d; ++j) s += q[j] * k[i * d + j];
        s *= scale;
        if (softcap > 0.0) s = softcap * tanh(s / softcap);
        double w = exp(s - mx);
        den += w;
        for (size_t j = 0; j < d; ++j) out[j] += w * v[i * d + j];
    }
    for (size_t j = 0; j < d; ++j) out[j] /= den;
    *lse = mx + log(den);
}
