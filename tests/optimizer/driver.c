/* driver.c - run a generated trainer's optimizer_step() for six steps on fixed gradients and
 * print the parameter buffer. Compiled with -DGENERATED="path/to/trainer.c"; the trainer's
 * main() is renamed and rt_main() and the kernels its other steps call are stubbed, so nothing
 * but libm is linked. (optimizer_step reads its hyperparameters from the model, through ctx.) */
#define main generated_main
#include GENERATED
#undef main

#include <stdio.h>
#include <stdlib.h>

int rt_main(int argc, char **argv, const RtModel *m) {
    (void)argc, (void)argv, (void)m;
    return 1;
}

/* Never called: forward_backward and eval_step are linked, as the model names them. */
void rt_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
    (void)beta, (void)C, (void)ldc;
    abort();
}

int main(void) {
    int64_t n = model.n_param_floats, ng = model.n_grad_floats;
    float *p = calloc((size_t)n, sizeof *p), *g = calloc((size_t)ng, sizeof *g);
    float *state = calloc((size_t)(model.n_state_slots * ng + 1), sizeof *state);
    if (!p || !g || !state) return 1;
    for (int64_t i = 0; i < n; i++) p[i] = sinf((float)i);
    RtCtx ctx = {.params = p, .grads = g, .optstate = state, .hyper = &model.hyper};
    for (int t = 1; t <= 6; t++) {
        for (int64_t i = 0; i < ng; i++) g[i] = cosf(0.37f * (float)i + (float)t);
        ctx.step = t - 1; /* steps taken before this one */
        ctx.lr = 0.01f * (1.0f + 0.1f * (float)t); /* a changing lr, as a schedule gives */
        optimizer_step(&ctx);
    }
    printf("%lld %lld\n", (long long)n, (long long)ng);
    for (int64_t i = 0; i < n; i++) printf("%.9g\n", p[i]);
    return 0;
}
