/* driver.c - run a generated trainer's optimizer_step() for six steps on fixed gradients and
 * print the parameter buffer. Compiled with -DGENERATED="path/to/trainer.c"; the trainer's
 * main() is renamed and rt_main() stubbed, so nothing but libm is linked. */
#define main generated_main
#include GENERATED
#undef main

#include <stdio.h>
#include <stdlib.h>

int rt_main(int argc, char **argv, const RtModel *m) {
    (void)argc, (void)argv, (void)m;
    return 1;
}

int main(void) {
    int64_t n = model.n_param_floats, ng = model.n_grad_floats;
    float *p = calloc((size_t)n, sizeof *p), *g = calloc((size_t)ng, sizeof *g);
    float *state = calloc((size_t)(model.n_state_slots * ng + 1), sizeof *state);
    if (!p || !g || !state) return 1;
    for (int64_t i = 0; i < n; i++) p[i] = sinf((float)i);
    RtCtx ctx = {.params = p, .grads = g, .optstate = state};
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
