/* rt_recipe.h - the training recipe, written once for both backends: the learning-rate schedule,
 * the optimizers' per-element updates, and the table of optimizers. The runtime and the
 * generated CPU code (C, through netrt.h) and the generated CUDA kernels (NVRTC, through
 * netrt_kernels.cuh, which netc hands this file as a header) call the same functions, so the
 * two backends cannot drift apart, and netc's front end and code generators read the table.
 *
 * The step base: `step` is the number of optimizer steps already taken, 0 in the first step
 * (RtCtx.step on the host, RtDevState.step on the device). The schedule is evaluated at `step`;
 * AdamW's bias correction uses step + 1, the count including the step being taken, as
 * torch.optim.AdamW does; SGD's momentum buffer starts at the first gradient (step 0).
 *
 * Every float operation of an update and its order are PyTorch's, and fixed: a hyperparameter
 * enters as the double the .net file gave, and a factor such as 1 - beta1 is formed in double
 * and rounded once to float, so an update compiles to the same bits wherever it runs.
 *
 * NVRTC has no standard headers: under it the includer (netrt_kernels.cuh) has defined the
 * fixed-width integer types, and pow, floor, cos, fmin, sqrt and sqrtf are built in.
 */
#ifndef RT_RECIPE_H
#define RT_RECIPE_H

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define RT_RECIPE_FN static __device__ __forceinline__
#else
#include <math.h>
#include <stdint.h>
#define RT_RECIPE_FN static inline
#endif

// ---- the learning-rate schedule

typedef enum {
    RT_SCHED_CONSTANT, /* base_lr throughout */
    RT_SCHED_STEP,     /* base_lr * gamma^floor(epoch / step_epochs), or floor(step / step_steps) */
    RT_SCHED_COSINE,   /* from base_lr down to min_lr over the run, half a cosine */
    RT_SCHED_POLY,     /* from base_lr down to min_lr over the steps after the warm-up, (1 - progress)^power */
} RtSchedKind;

typedef struct RtSchedule {
    RtSchedKind kind;
    double base_lr;
    double warmup_epochs; /* linear ramp to the schedule's rate over this many epochs (see rt_lr_at) */
    double step_epochs;   /* RT_SCHED_STEP: lr *= gamma every step_epochs epochs */
    double gamma;
    double min_lr;        /* RT_SCHED_COSINE, RT_SCHED_POLY: lr at the end of training (poly's end_lr) */
    /* the same two in optimizer steps instead of epochs (0: not given; the .net file gives one
     * of each pair, and a value here takes the place of its epoch twin) */
    double warmup_steps;  /* linear ramp over this many steps (warmup_steps = N) */
    double step_steps;    /* RT_SCHED_STEP: lr *= gamma every step_steps steps (step(every_steps = S)) */
    double power;         /* RT_SCHED_POLY: the exponent of the decay */
} RtSchedule;

/* The learning rate of the step taken after `step` steps, in a run of total_steps steps of
 * steps_per_epoch each (epochs may be fractional). The warm-up multiplies whatever the schedule
 * gives by (step + 1) / warm-up steps, so the first step's rate is not 0. With W warm-up steps
 * (warmup_steps, or warmup_epochs * steps_per_epoch), S = step_steps and T = total_steps this
 * is torch.optim.lr_scheduler.LambdaLR(opt, f) stepped once after every optimizer step, with
 *   f(k) = g(k) * ((k + 1) / W if k < W else 1),
 *   g(k) = 1 (constant), gamma^floor(k / S) (step),
 *          (min_lr + (base_lr - min_lr) * (1 + cos(pi * min(k / T, 1))) / 2) / base_lr (cosine), or
 *          (min_lr + (base_lr - min_lr) * (1 - min(max(k - W, 0) / (T - W), 1))^power) / base_lr (poly:
 *          the decay after the warm-up, as MLPerf's ResNet-50 and BERT recipes and Hugging Face's
 *          get_polynomial_decay_schedule_with_warmup decay; no decay when T <= W). */
RT_RECIPE_FN double rt_lr_at(const RtSchedule *s, int64_t step, int64_t steps_per_epoch, int64_t total_steps) {
    double e = (double)step / (double)steps_per_epoch, lr = s->base_lr;
    double warm = s->warmup_steps > 0 ? s->warmup_steps : s->warmup_epochs * (double)steps_per_epoch;
    switch (s->kind) {
    case RT_SCHED_CONSTANT: break;
    case RT_SCHED_STEP:
        if (s->step_steps > 0) lr = s->base_lr * pow(s->gamma, floor((double)step / s->step_steps));
        else lr = s->base_lr * pow(s->gamma, floor(e / s->step_epochs));
        break;
    case RT_SCHED_COSINE: {
        double total = (double)total_steps / (double)steps_per_epoch;
        lr = s->min_lr + (s->base_lr - s->min_lr) * (1 + cos(3.141592653589793 * fmin(e / total, 1.0))) / 2;
        break;
    }
    case RT_SCHED_POLY: {
        double span = (double)total_steps - warm;
        double done = span > 0 ? fmin(fmax((double)step - warm, 0.0) / span, 1.0) : 0.0;
        lr = s->min_lr + (s->base_lr - s->min_lr) * pow(1.0 - done, s->power);
        break;
    }
    }
    if (warm > 0 && (double)step < warm) lr *= ((double)step + 1) / warm;
    return lr;
}

// ---- gradient clipping

/* torch.nn.utils.clip_grad_norm_(params, max_norm): every trainable gradient is multiplied by
 * this factor before the update, given `norm`, the gradients' global 2-norm (summed in double
 * by the backend: rt_grad_norm on the CPU, two fixed-tree kernels on the device). As torch's,
 * min(max_norm / (norm + 1e-6), 1), and NaN when the norm is (the update then spreads it, as
 * torch's does with error_if_nonfinite=False); formed in double, rounded once to float. */
RT_RECIPE_FN float rt_clip_scale(double norm, double max_norm) {
    const double c = max_norm / (norm + 1e-6);
    return (float)(c > 1.0 ? 1.0 : c);
}

// ---- the optimizers

/* Every optimizer's hyperparameters, as the .net file gives them (a flag is 0 or 1); each
 * optimizer reads its own. netc writes them in this order into the generated code. */
#define RT_OPTIM_PARAMS(X)                                                     \
    X(momentum)     /* SGD, LARS */                                            \
    X(dampening)    /* SGD */                                                  \
    X(weight_decay) /* SGD and LARS (added to the gradient), AdamW and LAMB (decoupled) */ \
    X(beta1)        /* AdamW, LAMB */                                          \
    X(beta2)        /* AdamW, LAMB */                                          \
    X(eps)          /* AdamW, LAMB, LARS */                                    \
    X(nesterov)     /* SGD: 1 for Nesterov momentum */                         \
    X(eta)          /* LARS: the trust coefficient */

#define RT_OPTIM_PARAM_FIELD(name) double name;
typedef struct RtOptimParams {
    RT_OPTIM_PARAMS(RT_OPTIM_PARAM_FIELD)
} RtOptimParams;
#undef RT_OPTIM_PARAM_FIELD

/* What one step's update reads besides the elements, computed once per step. */
typedef struct RtOptimStep {
    float lr;        /* the schedule's rate for this step */
    int first;       /* the first step (step == 0) */
    float step_size; /* AdamW: lr / (1 - beta1^(step + 1)) */
    float bc2_sqrt;  /* AdamW: sqrt(1 - beta2^(step + 1)) */
    float decay;     /* AdamW: 1 - lr * weight_decay */
    float bc1, bc2;  /* LAMB: the bias corrections 1 - beta1^(step + 1) and 1 - beta2^(step + 1) */
} RtOptimStep;

/* An update reads and writes element i of the parameters p, its gradient g and its state: slot
 * k of the state is state[k * n + i], n the trainable floats. */

/* torch.optim.SGD(lr, momentum, dampening, weight_decay, nesterov); one slot (the momentum
 * buffer) when momentum is not 0, none without. */
RT_RECIPE_FN int rt_sgd_slots(RtOptimParams h) { return h.momentum != 0 ? 1 : 0; }

RT_RECIPE_FN RtOptimStep rt_sgd_step(RtOptimParams h, float lr, int64_t step) {
    (void)h;
    RtOptimStep s = {lr, step == 0, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    return s;
}

RT_RECIPE_FN void rt_sgd_update(RtOptimParams h, RtOptimStep s, float *p, const float *g, float *state, int64_t n,
                                int64_t i) {
    (void)n;
    float d = g[i];
    if (h.weight_decay != 0) d = g[i] + (float)h.weight_decay * p[i];
    if (h.momentum != 0) {
        float *buf = state;
        if (s.first) buf[i] = d; /* torch starts the buffer at the first gradient */
        else if (h.dampening != 0) buf[i] = buf[i] * (float)h.momentum + (float)(1 - h.dampening) * d;
        else buf[i] = buf[i] * (float)h.momentum + d;
        if (h.nesterov != 0) d = d + (float)h.momentum * buf[i];
        else d = buf[i];
    }
    p[i] -= s.lr * d;
}

/* torch.optim.AdamW(lr, betas, eps, weight_decay, amsgrad=False); two slots, the first and
 * second moments. The first moment moves by a lerp, as torch's does. */
RT_RECIPE_FN int rt_adamw_slots(RtOptimParams h) {
    (void)h;
    return 2;
}

RT_RECIPE_FN RtOptimStep rt_adamw_step(RtOptimParams h, float lr, int64_t step) {
    const double bc1 = 1.0 - pow(h.beta1, (double)(step + 1));
    const double bc2 = 1.0 - pow(h.beta2, (double)(step + 1));
    RtOptimStep s = {lr, step == 0, (float)(lr / bc1), (float)sqrt(bc2), (float)(1.0 - (double)lr * h.weight_decay),
                     0.0f, 0.0f};
    return s;
}

RT_RECIPE_FN void rt_adamw_update(RtOptimParams h, RtOptimStep s, float *p, const float *g, float *state, int64_t n,
                                  int64_t i) {
    float *m = state, *v = state + n;
    if (h.weight_decay != 0) p[i] *= s.decay;
    m[i] += (float)(1 - h.beta1) * (g[i] - m[i]);
    v[i] = v[i] * (float)h.beta2 + (float)(1 - h.beta2) * g[i] * g[i];
    p[i] += -s.step_size * (m[i] / (sqrtf(v[i]) / s.bc2_sqrt + (float)h.eps));
}

/* LAMB (You et al., "Large Batch Optimization for Deep Learning", 2019), as MLPerf's BERT
 * trains with it (NVIDIA's apex FusedLAMB: Adam moments with bias correction, decoupled weight
 * decay): per tensor, the Adam direction plus weight decay,
 *   u = (m / bc1) / (sqrt(v / bc2) + eps) + weight_decay * p,
 * is scaled by the trust ratio ||p|| / ||u|| (1 when either norm is 0), so
 *   p -= lr * ratio * u.
 * Parameters of no_decay take neither weight decay nor the trust ratio (MLPerf BERT's
 * exclude_from_layer_adaptation, apex's default): an Adam step. Two slots, m and v.
 *
 * A layer-wise optimizer updates in three passes (the backend's loops; docs/language.md):
 * rt_lamb_update moves the moments of element i and returns its u, whose squares and those of
 * p the backend sums per tensor in double; rt_lamb_ratio turns a tensor's two norms into its
 * factor; rt_lamb_apply recomputes u from the same state (the same bits) and moves p. */
RT_RECIPE_FN int rt_lamb_slots(RtOptimParams h) {
    (void)h;
    return 2;
}

RT_RECIPE_FN RtOptimStep rt_lamb_step(RtOptimParams h, float lr, int64_t step) {
    const double bc1 = 1.0 - pow(h.beta1, (double)(step + 1));
    const double bc2 = 1.0 - pow(h.beta2, (double)(step + 1));
    RtOptimStep s = {lr, step == 0, 0.0f, 0.0f, 0.0f, (float)bc1, (float)bc2};
    return s;
}

/* The update direction u of element i from the moments in state (slot 0 m, slot 1 v). */
RT_RECIPE_FN float rt_lamb_direction(RtOptimParams h, RtOptimStep s, const float *p, const float *state, int64_t n,
                                     int64_t i) {
    const float *m = state, *v = state + n;
    return (m[i] / s.bc1) / (sqrtf(v[i] / s.bc2) + (float)h.eps) + (float)h.weight_decay * p[i];
}

RT_RECIPE_FN float rt_lamb_update(RtOptimParams h, RtOptimStep s, const float *p, const float *g, float *state,
                                  int64_t n, int64_t i) {
    float *m = state, *v = state + n;
    m[i] = m[i] * (float)h.beta1 + (float)(1 - h.beta1) * g[i];
    v[i] = v[i] * (float)h.beta2 + (float)(1 - h.beta2) * g[i] * g[i];
    return rt_lamb_direction(h, s, p, state, n, i);
}

/* The factor of u for a tensor whose parameters and update have the 2-norms p_norm and
 * u_norm: lr times the trust ratio, or lr alone for the parameters of no_decay (adapt 0). */
RT_RECIPE_FN float rt_lamb_ratio(RtOptimParams h, RtOptimStep s, int adapt, double p_norm, double u_norm) {
    (void)h;
    if (!adapt || !(p_norm > 0) || !(u_norm > 0)) return s.lr;
    return (float)((double)s.lr * (p_norm / u_norm));
}

RT_RECIPE_FN void rt_lamb_apply(RtOptimParams h, RtOptimStep s, float ratio, float *p, const float *g, float *state,
                                int64_t n, int64_t i) {
    (void)g;
    p[i] -= ratio * rt_lamb_direction(h, s, p, state, n, i);
}

/* rt_lamb_apply with element i's u as rt_lamb_update returned it, kept by the backend (the
 * CPU's, over the gradient): the same bits, since u is a function of p and the state, which do
 * not change between the passes. */
RT_RECIPE_FN void rt_lamb_apply_kept(RtOptimParams h, RtOptimStep s, float ratio, float *p, const float *u,
                                     float *state, int64_t n, int64_t i) {
    (void)h, (void)s, (void)state, (void)n;
    p[i] -= ratio * u[i];
}

/* LARS (You, Gitman and Ginsburg, "Large Batch Training of Convolutional Networks", 2017) as
 * MLPerf's ResNet-50 trains with it (the MLPerf reference's LARS optimizer): per tensor, the
 * trust ratio of the parameters' and the gradient's 2-norms (the gradient before weight decay)
 *   ratio = eta * ||p|| / (||g|| + weight_decay * ||p|| + eps)      (1 when either norm is 0)
 * scales the learning rate of a momentum step on the decayed gradient,
 *   v = momentum * v + lr * ratio * (g + weight_decay * p),   p -= v.
 * The parameters of no_decay take neither weight decay nor the trust ratio (the reference's
 * skip_list: batch norm and biases): v = momentum * v + lr * g. One slot, v, from zero; the
 * learning rate is inside the momentum, as the reference's (not torch.optim.SGD's, outside).
 *
 * In the layer-wise passes rt_lars_update returns the gradient itself as the direction u, whose
 * norm the ratio needs, and moves nothing; rt_lars_apply moves v and p. */
RT_RECIPE_FN int rt_lars_slots(RtOptimParams h) {
    (void)h;
    return 1;
}

RT_RECIPE_FN RtOptimStep rt_lars_step(RtOptimParams h, float lr, int64_t step) {
    (void)h;
    RtOptimStep s = {lr, step == 0, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    return s;
}

RT_RECIPE_FN float rt_lars_update(RtOptimParams h, RtOptimStep s, const float *p, const float *g, float *state,
                                  int64_t n, int64_t i) {
    (void)h, (void)s, (void)p, (void)state, (void)n;
    return g[i];
}

RT_RECIPE_FN float rt_lars_ratio(RtOptimParams h, RtOptimStep s, int adapt, double p_norm, double g_norm) {
    if (!adapt || !(p_norm > 0) || !(g_norm > 0)) return s.lr;
    return (float)((double)s.lr * (h.eta * p_norm / (g_norm + h.weight_decay * p_norm + h.eps)));
}

RT_RECIPE_FN void rt_lars_apply(RtOptimParams h, RtOptimStep s, float factor, float *p, const float *g, float *state,
                                int64_t n, int64_t i) {
    (void)s, (void)n;
    float *v = state;
    v[i] = v[i] * (float)h.momentum + factor * (g[i] + (float)h.weight_decay * p[i]);
    p[i] -= v[i];
}

/* The same from u, the gradient, kept by the backend where it was. */
RT_RECIPE_FN void rt_lars_apply_kept(RtOptimParams h, RtOptimStep s, float factor, float *p, const float *u,
                                     float *state, int64_t n, int64_t i) {
    rt_lars_apply(h, s, factor, p, u, state, n, i);
}

/* The table of optimizers, one row each: X(ID, fn, layerwise, signature)
 *   ID         the enum RT_OPTIM_<ID>
 *   fn         the name: as written in .net, recorded in checkpoints, and the prefix of its
 *              functions above: rt_<fn>_slots, rt_<fn>_step (once per step, from the
 *              learning rate and the step count) and rt_<fn>_update (one element)
 *   layerwise  1 when the update scales each tensor by a factor of its norms (LAMB, LARS): then
 *              rt_<fn>_update returns the element's direction u, and rt_<fn>_ratio (of the
 *              tensor's norms of p and u) and rt_<fn>_apply (from the state and the gradient)
 *              or rt_<fn>_apply_kept (from the u the backend kept over the gradient) finish
 *              the update (see LAMB above)
 *   signature  its .net arguments in order, with their defaults (lr comes first and has none);
 *              netc binds a call by these names and reads each hyperparameter's default here
 *
 * How to add an optimizer: a row here; its three functions above, reading its hyperparameters
 * from RtOptimParams (a new one is a line of RT_OPTIM_PARAMS and an entry in sema_train.c's
 * table of hyperparameters, which checks its value); its section in docs/language.md; a case
 * against torch.optim in tests/optimizer, or against its formula written in tests/torch's
 * recipe_crosscheck.py (LAMB and LARS, which torch lacks). A layer-wise one's passes are the backends'
 * (codegen/cpu.c: emit_layerwise*, codegen/cuda_step.c: cu_layerwise*). Nothing else names an optimizer. */
#define RT_OPTIMIZERS(X)                                                           \
    X(SGD, sgd, 0, "lr, momentum=0, dampening=0, weight_decay=0, nesterov=false") \
    X(ADAMW, adamw, 0, "lr, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01")     \
    X(LAMB, lamb, 1, "lr, betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01")    \
    X(LARS, lars, 1, "lr, momentum=0.9, weight_decay=0, eta=0.001, eps=0")

#define RT_OPTIM_ENUM(ID, fn, layerwise, signature) RT_OPTIM_##ID,
typedef enum { RT_OPTIMIZERS(RT_OPTIM_ENUM) RT_N_OPTIMS } RtOptimKind;
#undef RT_OPTIM_ENUM

#if !defined(__CUDACC_RTC__) && !defined(__CUDACC__)
/* One row of the table, for the host: the runtime's checkpoints and netc. */
typedef struct RtOptimizer {
    const char *name;      /* "sgd" */
    const char *signature; /* "lr, momentum=0, ..." */
    const char *enum_name; /* "RT_OPTIM_SGD", for generated code */
    const char *step_fn;   /* "rt_sgd_step" */
    const char *update_fn; /* "rt_sgd_update" */
    int (*slots)(RtOptimParams h);
    const char *ratio_fn;  /* a layer-wise optimizer's "rt_lamb_ratio" (or LARS'); NULL for the others */
    const char *apply_fn;  /* its "rt_lamb_apply"; NULL for the others */
    const char *apply_kept_fn; /* its "rt_lamb_apply_kept"; NULL for the others */
    const char *range_fn;  /* an element-wise one's "rt_sgd_update_range" (the CPU's loop); NULL for the others */
} RtOptimizer;

/* The element-wise updates over elements [i0, i1), for the CPU's threads: the same arithmetic
 * as the element functions, with the hyperparameters' tests taken once for the range where the
 * common cases allow, so that the loop can vectorise (RT_SIMD: where OpenMP is, the trainer).
 * SGD's does; AdamW's too where sqrtf need not set errno (netc builds trainers with
 * -fno-math-errno), else its sqrtf stays a call. */
#ifdef _OPENMP
#define RT_SIMD _Pragma("omp simd")
#else
#define RT_SIMD
#endif
RT_RECIPE_FN void rt_sgd_update_range(RtOptimParams h, RtOptimStep s, float *p, const float *g, float *state, int64_t n,
                                      int64_t i0, int64_t i1) {
    if (h.momentum != 0 && h.dampening == 0 && h.nesterov == 0 && !s.first) { /* buf = m buf + d, p -= lr buf */
        /* literals for the compiler, so that rt_sgd_update's tests fold away */
        h.dampening = 0, h.nesterov = 0, s.first = 0;
        if (h.weight_decay != 0) {
            RT_SIMD
            for (int64_t i = i0; i < i1; i++) rt_sgd_update(h, s, p, g, state, n, i);
        } else {
            h.weight_decay = 0;
            RT_SIMD
            for (int64_t i = i0; i < i1; i++) rt_sgd_update(h, s, p, g, state, n, i);
        }
        return;
    }
    for (int64_t i = i0; i < i1; i++) rt_sgd_update(h, s, p, g, state, n, i);
}

RT_RECIPE_FN void rt_adamw_update_range(RtOptimParams h, RtOptimStep s, float *p, const float *g, float *state,
                                        int64_t n, int64_t i0, int64_t i1) {
    if (h.weight_decay != 0) {
        RT_SIMD
        for (int64_t i = i0; i < i1; i++) rt_adamw_update(h, s, p, g, state, n, i);
    } else {
        h.weight_decay = 0; /* a literal for the compiler: the element function's test folds away */
        RT_SIMD
        for (int64_t i = i0; i < i1; i++) rt_adamw_update(h, s, p, g, state, n, i);
    }
}

RT_RECIPE_FN const RtOptimizer *rt_optimizer(RtOptimKind k) {
#define RT_OPTIM_ROW(ID, fn, layerwise, signature)                                              \
    {#fn, signature, "RT_OPTIM_" #ID, "rt_" #fn "_step", "rt_" #fn "_update", rt_##fn##_slots, \
     (layerwise) ? "rt_" #fn "_ratio" : NULL, (layerwise) ? "rt_" #fn "_apply" : NULL,              \
     (layerwise) ? "rt_" #fn "_apply_kept" : NULL, (layerwise) ? NULL : "rt_" #fn "_update_range"},
    static const RtOptimizer rows[] = {RT_OPTIMIZERS(RT_OPTIM_ROW)};
#undef RT_OPTIM_ROW
    return &rows[k];
}
#endif

#endif
