/* f32 kernels of the training stack; contracts in nn/kernels.h. */
#include "nn/kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#define XMP_LN_EPS 1e-5f
#define XMP_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define XMP_GELU_C 0.044715f

/* ---- embeddings ---- */

void xmp_embed_range_fwd(float *out, const int *tok, size_t N, const float *table, int v0,
                         int vlocal, int C)
{
    for (size_t n = 0; n < N; n++) {
        float *o = out + n * (size_t)C;
        int r = tok[n] - v0;
        if (r >= 0 && r < vlocal)
            memcpy(o, table + (size_t)r * C, (size_t)C * sizeof(float));
        else
            memset(o, 0, (size_t)C * sizeof(float));
    }
}

void xmp_embed_range_bwd(float *dtable, const float *dout, const int *tok, size_t N, int v0,
                         int vlocal, int C)
{
    for (size_t n = 0; n < N; n++) {
        int r = tok[n] - v0;
        if (r < 0 || r >= vlocal)
            continue;
        float *d = dtable + (size_t)r * C;
        const float *g = dout + n * (size_t)C;
        for (int i = 0; i < C; i++)
            d[i] += g[i];
    }
}

void xmp_pos_add_fwd(float *out, const float *wpe, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *p = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++)
                o[i] += p[i];
        }
}

void xmp_pos_add_bwd(float *dwpe, const float *dout, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *g = dout + ((size_t)b * T + t) * C;
            float *d = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++)
                d[i] += g[i];
        }
}

/* ---- layernorm ---- */

void xmp_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, size_t N, int C)
{
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * (size_t)C;
        float *o = out + n * (size_t)C;
        float m = 0.0f;
        for (int i = 0; i < C; i++)
            m += x[i];
        m /= (float)C;
        float var = 0.0f;
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            var += d * d;
        }
        var /= (float)C;
        float s = 1.0f / sqrtf(var + XMP_LN_EPS);
        for (int i = 0; i < C; i++)
            o[i] = (x[i] - m) * s * weight[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void xmp_layernorm_bwd(float *dinp, float *dweight, float *dbias, const float *dout,
                       const float *inp, const float *weight, const float *mean, const float *rstd,
                       size_t N, int C)
{
    for (size_t n = 0; n < N; n++) {
        const float *g = dout + n * (size_t)C;
        const float *x = inp + n * (size_t)C;
        float m = mean[n], s = rstd[n];
        if (dweight || dbias) {
            for (int i = 0; i < C; i++) {
                if (dbias)
                    dbias[i] += g[i];
                if (dweight)
                    dweight[i] += (x[i] - m) * s * g[i];
            }
        }
        if (!dinp)
            continue;
        /* dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = w * g */
        float mean_d = 0.0f, mean_dx = 0.0f;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s;
            float dxhat = weight[i] * g[i];
            mean_d += dxhat;
            mean_dx += dxhat * xhat;
        }
        mean_d /= (float)C;
        mean_dx /= (float)C;
        float *dx = dinp + n * (size_t)C;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s;
            float dxhat = weight[i] * g[i];
            dx[i] += (dxhat - mean_d - xhat * mean_dx) * s;
        }
    }
}

/* ---- matmul ---- */

void xmp_matmul_fwd(float *out, const float *inp, const float *weight, const float *bias, size_t N,
                    int C, int OC)
{
    float beta = 0.0f;
    if (bias) {
        for (size_t n = 0; n < N; n++)
            memcpy(out + n * (size_t)OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, OC, C, 1.0f, inp, C, weight, C,
                beta, out, OC);
}

void xmp_matmul_bwd_input(float *dinp, const float *dout, const float *weight, size_t N, int C,
                          int OC)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
}

void xmp_matmul_bwd_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                           size_t N, int C, int OC)
{
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, (int)N, 1.0f, dout, OC, inp, C,
                1.0f, dweight, C);
    if (dbias) {
        for (size_t n = 0; n < N; n++) {
            const float *g = dout + n * (size_t)OC;
            for (int o = 0; o < OC; o++)
                dbias[o] += g[o];
        }
    }
}

/* ---- attention ---- */

void xmp_attention_fwd(float *out, float *preatt, float *att, const float *qkv, int B, int T,
                       int NH, int hs)
{
    const size_t C = (size_t)NH * hs, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                size_t row = (((size_t)b * NH + h) * T + t) * T;
                float *a = att + row;
                float maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                    float dot = 0.0f;
                    for (int i = 0; i < hs; i++)
                        dot += q[i] * k[i];
                    dot *= scale;
                    a[t2] = dot;
                    if (dot > maxv)
                        maxv = dot;
                }
                if (preatt) {
                    memcpy(preatt + row, a, (size_t)(t + 1) * sizeof(float));
                    for (int t2 = t + 1; t2 < T; t2++)
                        preatt[row + t2] = 0.0f;
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] = expf(a[t2] - maxv);
                    sum += a[t2];
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++)
                    a[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++)
                    a[t2] = 0.0f;
                float *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                memset(o, 0, (size_t)hs * sizeof(float));
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C + (size_t)h * hs;
                    float w = a[t2];
                    for (int i = 0; i < hs; i++)
                        o[i] += w * v[i];
                }
            }
}

void xmp_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *att, int B,
                       int T, int NH, int hs, float *work)
{
    const size_t C = (size_t)NH * hs, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    float *datt = work;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *a = att + (((size_t)b * NH + h) * T + t) * T;
                const float *g = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                /* through out = att . v */
                float dot_ad = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t off = ((size_t)b * T + t2) * C3 + 2 * C + (size_t)h * hs;
                    const float *v = qkv + off;
                    float *dv = dqkv + off;
                    float d = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        d += v[i] * g[i];
                        dv[i] += a[t2] * g[i];
                    }
                    datt[t2] = d;
                    dot_ad += a[t2] * d;
                }
                /* through softmax, then scores = scale * q.k */
                for (int t2 = 0; t2 <= t; t2++) {
                    float dpre = a[t2] * (datt[t2] - dot_ad) * scale;
                    size_t off = ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                    const float *k = qkv + off;
                    float *dk = dqkv + off;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += k[i] * dpre;
                        dk[i] += q[i] * dpre;
                    }
                }
            }
}

/* ---- pointwise ---- */

void xmp_gelu_fwd(float *out, const float *inp, size_t N)
{
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(XMP_GELU_K * (x + XMP_GELU_C * x * x * x)));
    }
}

void xmp_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t N)
{
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = XMP_GELU_K * (x + XMP_GELU_C * x * x * x);
        float th = tanhf(u);
        float ch = coshf(u);
        float sech2 = 1.0f / (ch * ch); /* 0 when cosh overflows, which is the limit */
        float du = XMP_GELU_K * (1.0f + 3.0f * XMP_GELU_C * x * x);
        float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
        dinp[i] += local * dout[i];
    }
}

void xmp_residual_fwd(float *out, const float *a, const float *b, size_t N)
{
    for (size_t i = 0; i < N; i++)
        out[i] = a[i] + b[i];
}

void xmp_residual_bwd(float *da, float *db, const float *dout, size_t N)
{
    for (size_t i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

/* ---- cross-entropy, serial ---- */

void xmp_softmax_fwd(float *probs, const float *logits, size_t N, int V, int Vp)
{
    for (size_t n = 0; n < N; n++) {
        const float *x = logits + n * (size_t)Vp;
        float *p = probs + n * (size_t)Vp;
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++)
            if (x[i] > maxv)
                maxv = x[i];
        float sum = 0.0f;
        for (int i = 0; i < V; i++) {
            p[i] = expf(x[i] - maxv);
            sum += p[i];
        }
        float inv = 1.0f / sum;
        for (int i = 0; i < V; i++)
            p[i] *= inv;
        for (int i = V; i < Vp; i++)
            p[i] = 0.0f;
    }
}

void xmp_crossentropy_fwd(float *losses, const float *probs, const int *targets, size_t N, int Vp)
{
    for (size_t n = 0; n < N; n++)
        losses[n] = -logf(probs[n * (size_t)Vp + targets[n]]);
}

void xmp_crossentropy_softmax_bwd(float *dlogits, const float *dlosses, const float *probs,
                                  const int *targets, size_t N, int V, int Vp)
{
    for (size_t n = 0; n < N; n++) {
        float *d = dlogits + n * (size_t)Vp;
        const float *p = probs + n * (size_t)Vp;
        float g = dlosses[n];
        for (int i = 0; i < V; i++)
            d[i] += (p[i] - (i == targets[n] ? 1.0f : 0.0f)) * g;
    }
}

/* ---- cross-entropy, vocab-split pieces ---- */

/* number of owned columns that are real (global index < V) */
static int real_cols(int v0, int vlocal, int V)
{
    int n = V - v0;
    if (n < 0)
        return 0;
    return n < vlocal ? n : vlocal;
}

void xmp_xent_local_max(float *rowmax, const float *logits, size_t N, int v0, int vlocal, int V)
{
    int nr = real_cols(v0, vlocal, V);
    for (size_t n = 0; n < N; n++) {
        const float *x = logits + n * (size_t)vlocal;
        float m = -INFINITY;
        for (int j = 0; j < nr; j++)
            if (x[j] > m)
                m = x[j];
        rowmax[n] = m;
    }
}

void xmp_xent_local_sumexp(float *rowsum, const float *logits, const float *gmax, size_t N, int v0,
                           int vlocal, int V)
{
    int nr = real_cols(v0, vlocal, V);
    for (size_t n = 0; n < N; n++) {
        const float *x = logits + n * (size_t)vlocal;
        float s = 0.0f;
        for (int j = 0; j < nr; j++)
            s += expf(x[j] - gmax[n]);
        rowsum[n] = s;
    }
}

void xmp_xent_local_target(float *tlogit, const float *logits, const int *targets, size_t N, int v0,
                           int vlocal)
{
    for (size_t n = 0; n < N; n++) {
        int j = targets[n] - v0;
        tlogit[n] = (j >= 0 && j < vlocal) ? logits[n * (size_t)vlocal + j] : 0.0f;
    }
}

void xmp_xent_losses(float *losses, const float *gmax, const float *gsum, const float *tlogit,
                     size_t N)
{
    for (size_t n = 0; n < N; n++)
        losses[n] = logf(gsum[n]) + gmax[n] - tlogit[n];
}

void xmp_xent_local_bwd(float *dlogits, const float *logits, const float *gmax, const float *gsum,
                        const int *targets, const float *dlosses, size_t N, int v0, int vlocal,
                        int V)
{
    int nr = real_cols(v0, vlocal, V);
    for (size_t n = 0; n < N; n++) {
        const float *x = logits + n * (size_t)vlocal;
        float *d = dlogits + n * (size_t)vlocal;
        float inv = 1.0f / gsum[n], g = dlosses[n];
        int tj = targets[n] - v0;
        for (int j = 0; j < nr; j++) {
            float p = expf(x[j] - gmax[n]) * inv;
            d[j] += (p - (j == tj ? 1.0f : 0.0f)) * g;
        }
    }
}

/* ---- AdamW ---- */

void xmp_adamw(float *params, const float *grads, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, int t)
{
    float c1 = 1.0f - powf(beta1, (float)t);
    float c2 = 1.0f - powf(beta2, (float)t);
    for (size_t i = 0; i < n; i++) {
        float g = grads[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / c1, vhat = vi / c2;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
    }
}

/* ---- random numbers ---- */

uint64_t xmp_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* hash of (seed, stream, counter): three chained splitmix64 mixes */
static uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t ctr)
{
    uint64_t s = seed;
    uint64_t a = xmp_splitmix64(&s);
    s = a ^ stream;
    uint64_t b = xmp_splitmix64(&s);
    s = b ^ ctr;
    return xmp_splitmix64(&s);
}

float xmp_normal_at(uint64_t seed, uint64_t stream, uint64_t index)
{
    /* 53-bit uniforms; u1 in (0, 1] keeps log finite */
    double u1 = ((hash3(seed, stream, 2 * index) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (hash3(seed, stream, 2 * index + 1) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void xmp_normal_fill(float *dst, size_t n, uint64_t seed, uint64_t stream, uint64_t first_index,
                     float std)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = std * xmp_normal_at(seed, stream, first_index + i);
}

void xmp_mt19937_seed(xmp_mt19937_t *r, uint32_t seed)
{
    r->mt[0] = seed;
    for (uint32_t j = 1; j < 624; j++)
        r->mt[j] = 1812433253u * (r->mt[j - 1] ^ (r->mt[j - 1] >> 30)) + j;
    r->idx = 624; /* regenerate on first draw */
}

static void mt_twist(xmp_mt19937_t *r)
{
    for (int j = 0; j < 624; j++) {
        uint32_t y = (r->mt[j] & 0x80000000u) | (r->mt[(j + 1) % 624] & 0x7fffffffu);
        uint32_t next = r->mt[(j + 397) % 624] ^ (y >> 1);
        r->mt[j] = (y & 1u) ? next ^ 0x9908b0dfu : next;
    }
    r->idx = 0;
}

uint32_t xmp_mt19937_u32(xmp_mt19937_t *r)
{
    if (r->idx >= 624)
        mt_twist(r);
    uint32_t y = r->mt[r->idx++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

void xmp_mt19937_permute(int *a, int n, xmp_mt19937_t *r)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(xmp_mt19937_u32(r) % (uint32_t)(i + 1));
        int tmp = a[i];
        a[i] = a[j];
        a[j] = tmp;
    }
}
