/* test_autodiff.c - the structure of the backward graphs that ad_differentiate() builds.
 *
 * The gradcheck suite (tests/gradcheck) checks the numbers end to end; these tests pin down the
 * shape of the backward pass on small hand-built graphs: how uses accumulate, what frozen and
 * unused parameters get, the trans flags of matrix-product gradients, the reductions that undo
 * broadcasting, that integer values never get gradients, and attention's packed gradient. Every test also checks the
 * invariants of the whole pass (phase, n_fwd, ir_verify).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "passes.h"

static const SrcLoc loc = {"test.net", 1, 1};

typedef struct Fixture {
    Arena arena;
    IrGraph *g;
} Fixture;

static int setup(void **state) {
    Fixture *f = xcalloc(1, sizeof *f);
    f->g = ir_graph_new(&f->arena);
    f->g->model_name = "test";
    f->g->batch = 4;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    Fixture *f = *state;
    arena_free(&f->arena);
    free(f);
    return 0;
}

static IrGraph *graph(void **state) { return ((Fixture *)*state)->g; }

static IrShape s1(int64_t a) { return ir_shape(1, a); }
static IrShape s2(int64_t a, int64_t b) { return ir_shape(2, a, b); }

static IrNode *param(IrGraph *g, const char *name, IrShape s) {
    return ir_add_param(g, name, s, INIT_NORMAL, 1.0, loc)->node;
}

static IrNode *ew(IrGraph *g, IrOp op, IrNode *a, IrNode *b) {
    IrShape s = a->shape;
    if (b) assert_true(ir_broadcast(&a->shape, &b->shape, &s));
    return ir_add(g, op, s, a->dtype, loc, b ? 2 : 1, a, b);
}

static IrNode *mean(IrGraph *g, IrNode *x) {
    return ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, loc, 1, x);
}

/* Run the pass and check what holds for every graph: n_fwd, phases, verifier, grad shapes. */
static void differentiate(IrGraph *g, IrNode *loss) {
    g->loss = loss;
    int n = g->n;
    assert_int_equal(ad_differentiate(g), 0);
    assert_int_equal(g->n_fwd, n);
    for (int i = 0; i < g->n; i++) assert_int_equal(g->nodes[i]->phase, i < n ? PHASE_FWD : PHASE_BWD);
    assert_true(ir_verify(g, "autodiff"));
    for (int i = 0; i < g->n_params; i++) {
        IrParam *p = &g->params[i];
        if (!p->trainable) continue;
        assert_non_null(p->grad);
        assert_true(ir_shape_eq(&p->grad->shape, &p->node->shape));
        assert_int_equal(p->grad->phase, PHASE_BWD);
    }
}

static int count_bwd(const IrGraph *g, IrOp op) {
    int c = 0;
    for (int i = g->n_fwd; i < g->n; i++) c += g->nodes[i]->op == op;
    return c;
}

static int bwd_uses(const IrGraph *g, const IrNode *x) {
    int c = 0;
    for (int i = g->n_fwd; i < g->n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) c += g->nodes[i]->in[k] == x;
    return c;
}

/* y = x * x + relu(x): three contributions to dx, summed by two ADDs. */
static void test_accumulation(void **state) {
    IrGraph *g = graph(state);
    IrNode *x = param(g, "x", s2(4, 8));
    IrNode *y = ew(g, OP_ADD, ew(g, OP_MUL, x, x), ew(g, OP_RELU, x, NULL));
    differentiate(g, mean(g, y));
    IrNode *dx = g->params[0].grad;
    assert_int_equal(dx->op, OP_ADD);
    assert_int_equal(count_bwd(g, OP_ADD), 2);
    assert_int_equal(count_bwd(g, OP_RELU_GRAD), 1);
    assert_int_equal(count_bwd(g, OP_CONST), 2); /* the seed and 1/numel */
    assert_int_equal(g->nodes[g->n_fwd]->op, OP_CONST);
    assert_true(g->nodes[g->n_fwd]->attr.scalar == 1.0);
}

/* y = p * q with q frozen: q gets no gradient, so nothing computes dy * p. */
static void test_frozen_param(void **state) {
    IrGraph *g = graph(state);
    IrNode *p = param(g, "p", s2(4, 8));
    IrNode *q = param(g, "q", s2(4, 8));
    g->params[1].trainable = 0;
    differentiate(g, mean(g, ew(g, OP_MUL, p, q)));
    assert_null(g->params[1].grad);
    assert_int_equal(bwd_uses(g, p), 0);
    assert_int_equal(bwd_uses(g, q), 1);
    assert_int_equal(g->params[0].grad->op, OP_MUL);
}

/* An unused trainable parameter gets EXPAND(CONST 0) of its shape. */
static void test_unused_param(void **state) {
    IrGraph *g = graph(state);
    IrNode *p = param(g, "p", s1(8));
    param(g, "unused", ir_shape(3, (int64_t)2, (int64_t)3, (int64_t)5));
    differentiate(g, mean(g, ew(g, OP_RELU, p, NULL)));
    IrNode *z = g->params[1].grad;
    assert_int_equal(z->op, OP_EXPAND);
    assert_true(ir_shape_eq(&z->shape, &g->params[1].node->shape));
    assert_int_equal(z->in[0]->op, OP_CONST);
    assert_true(z->in[0]->attr.scalar == 0.0);
}

/* A loss that depends on no trainable parameter: no backward pass but the zero gradients. */
static void test_loss_without_params(void **state) {
    IrGraph *g = graph(state);
    IrNode *x = ir_add_input(g, "x", s2(4, 8), DT_F32, loc);
    param(g, "p", s1(8));
    differentiate(g, mean(g, x));
    assert_int_equal(g->n - g->n_fwd, 2);
    assert_int_equal(g->params[0].grad->op, OP_EXPAND);
}

/* C = op(A) op(B) for one flag combination; checks both gradients' operands and flags. */
static void check_matmul(void **state, int batched, int ta, int tb) {
    IrGraph *g = graph(state);
    int64_t M = 3, K = 5, N = 2;
    IrShape sa = ta ? s2(K, M) : s2(M, K), sb = tb ? s2(N, K) : s2(K, N), sc = s2(M, N);
    if (batched) {
        IrShape *all[] = {&sa, &sb, &sc};
        for (int i = 0; i < 3; i++) *all[i] = ir_shape(3, (int64_t)2, all[i]->dim[0], all[i]->dim[1]);
    }
    IrNode *a = param(g, "a", sa), *b = param(g, "b", sb);
    IrNode *c = ir_add(g, OP_MATMUL, sc, DT_F32, loc, 2, a, b);
    c->attr.trans_a = ta;
    c->attr.trans_b = tb;
    differentiate(g, mean(g, c));
    IrNode *da = g->params[0].grad, *db = g->params[1].grad, *dc = da->in[ta ? 1 : 0];
    assert_int_equal(da->op, OP_MATMUL);
    assert_int_equal(db->op, OP_MATMUL);
    /* the table in autodiff.c: dA = dC·op(B)ᵀ or op(B)·dCᵀ, dB = op(A)ᵀ·dC or dCᵀ·op(A) */
    assert_ptr_equal(da->in[ta ? 0 : 1], b);
    assert_int_equal(da->attr.trans_a, ta ? tb : 0);
    assert_int_equal(da->attr.trans_b, ta ? 1 : !tb);
    assert_ptr_equal(db->in[tb ? 0 : 1], dc);
    assert_ptr_equal(db->in[tb ? 1 : 0], a);
    assert_int_equal(db->attr.trans_a, tb ? 1 : !ta);
    assert_int_equal(db->attr.trans_b, tb ? ta : 0);
    assert_int_equal(dc->op, OP_EXPAND);
}

static void test_matmul_nn(void **state) { check_matmul(state, 0, 0, 0); }
static void test_matmul_nt(void **state) { check_matmul(state, 0, 0, 1); }
static void test_matmul_tn(void **state) { check_matmul(state, 0, 1, 0); }
static void test_matmul_tt(void **state) { check_matmul(state, 0, 1, 1); }
static void test_matmul_batched_nn(void **state) { check_matmul(state, 1, 0, 0); }
static void test_matmul_batched_tt(void **state) { check_matmul(state, 1, 1, 1); }

/* a [4,8] + b [8], c [4,1], d scalar: each operand's gradient is summed to its own shape. */
static void test_broadcast_add(void **state) {
    IrGraph *g = graph(state);
    IrNode *a = param(g, "a", s2(4, 8)), *b = param(g, "b", s1(8));
    IrNode *c = param(g, "c", s2(4, 1)), *d = param(g, "d", ir_scalar_shape());
    IrNode *y = ew(g, OP_ADD, ew(g, OP_ADD, ew(g, OP_ADD, a, b), c), d);
    differentiate(g, mean(g, y));
    assert_int_equal(g->params[0].grad->op, OP_EXPAND); /* same shape: dy itself */
    IrOp want[] = {OP_SUM_TO, OP_SUM_TO, OP_SUM};
    for (int i = 1; i < 4; i++) {
        IrNode *gr = g->params[i].grad;
        assert_int_equal(gr->op, want[i - 1]);
        assert_true(ir_shape_eq(&gr->shape, &g->params[i].node->shape));
    }
}

/* MUL and DIV with broadcasting: the product is computed at the full shape, then summed. */
static void test_broadcast_mul_div(void **state) {
    IrGraph *g = graph(state);
    IrNode *a = param(g, "a", s2(4, 8)), *b = param(g, "b", s1(8));
    IrNode *y = ew(g, OP_DIV, ew(g, OP_MUL, a, b), b);
    differentiate(g, mean(g, y));
    IrNode *db = g->params[1].grad;
    assert_int_equal(db->op, OP_ADD);
    assert_int_equal(db->in[0]->op, OP_SUM_TO);
    assert_int_equal(db->in[1]->op, OP_SUM_TO);
}

/* An i64 label cast to f32 and multiplied by a param: no gradient flows into integers. */
static void test_integer_inputs(void **state) {
    IrGraph *g = graph(state);
    IrNode *lab = ir_add_input(g, "label", s1(4), DT_I64, loc);
    IrNode *x = ir_add_input(g, "x", s2(4, 10), DT_F32, loc);
    IrNode *w = param(g, "w", s1(4));
    IrNode *f = ir_add(g, OP_CAST, s1(4), DT_F32, loc, 1, lab);
    IrNode *m = ew(g, OP_MUL, f, w);
    IrNode *r = ir_add(g, OP_RESHAPE, s2(4, 1), DT_F32, loc, 1, m);
    IrNode *logits = ew(g, OP_MUL, x, r);
    IrNode *xent = ir_add(g, OP_XENT, s1(4), DT_F32, loc, 2, logits, lab);
    differentiate(g, mean(g, xent));
    for (int i = g->n_fwd; i < g->n; i++) {
        assert_int_equal(g->nodes[i]->dtype, DT_F32);
        assert_int_not_equal(g->nodes[i]->op, OP_CAST);
    }
    assert_int_equal(count_bwd(g, OP_XENT_BWD), 1);
    assert_int_equal(bwd_uses(g, r), 0); /* dx = dlogits * r is never built: x is an input */
    assert_int_equal(bwd_uses(g, f), 1); /* dw = dm * f */
    assert_int_equal(g->params[0].grad->op, OP_MUL);
}

/* conv2d with bias: both gradients carry the forward attributes; the bias is summed. */
static void test_conv2d(void **state) {
    IrGraph *g = graph(state);
    IrNode *x = ir_add_input(g, "x", ir_shape(4, (int64_t)2, (int64_t)4, (int64_t)5, (int64_t)5), DT_F32, loc);
    IrNode *w = param(g, "w", ir_shape(4, (int64_t)6, (int64_t)2, (int64_t)3, (int64_t)3));
    IrNode *bias = param(g, "b", s1(6));
    IrNode *y = ir_add(g, OP_CONV2D, ir_shape(4, (int64_t)2, (int64_t)6, (int64_t)2, (int64_t)2),
                       DT_F32, loc, 2, x, w);
    y->attr = (IrAttrs){.stride = {2, 2}, .pad = {1, 1}, .dil = {2, 2}, .groups = 2}; /* a 3x3 filter: w's shape */
    IrNode *b3 = ir_add(g, OP_RESHAPE, ir_shape(3, (int64_t)6, (int64_t)1, (int64_t)1), DT_F32, loc, 1, bias);
    differentiate(g, mean(g, ew(g, OP_ADD, y, b3)));
    IrNode *dw = g->params[0].grad, *db = g->params[1].grad;
    assert_int_equal(dw->op, OP_CONV2D_BWD_FILTER);
    assert_int_equal(dw->attr.groups, 2);
    assert_int_equal(dw->attr.dil[1], 2);
    assert_int_equal(dw->attr.stride[0], 2);
    assert_int_equal(count_bwd(g, OP_CONV2D_BWD_DATA), 0); /* x is an input */
    assert_int_equal(db->op, OP_RESHAPE);
    assert_int_equal(db->in[0]->op, OP_SUM_TO);
}

/* Attention: one ATTENTION_BWD node gives dq, dk and dv, packed, and PART views at their
 * offsets project the gradients of the operands that need them (v is an input here). */
static void test_attention(void **state) {
    IrGraph *g = graph(state);
    IrShape sq = ir_shape(4, (int64_t)2, (int64_t)3, (int64_t)5, (int64_t)4);
    IrShape sk = ir_shape(4, (int64_t)2, (int64_t)3, (int64_t)7, (int64_t)4);
    IrShape sv = ir_shape(4, (int64_t)2, (int64_t)3, (int64_t)7, (int64_t)6);
    IrNode *q = param(g, "q", sq), *k = param(g, "k", sk), *v = ir_add_input(g, "v", sv, DT_F32, loc);
    IrShape sy = ir_shape(4, (int64_t)2, (int64_t)3, (int64_t)5, (int64_t)6);
    IrNode *y = ir_add(g, OP_ATTENTION, sy, DT_F32, loc, 3, q, k, v);
    y->attr.causal = 1, y->attr.attn_scale = 0.5;
    differentiate(g, mean(g, y));
    IrNode *dq = g->params[0].grad, *dk = g->params[1].grad;
    assert_int_equal(count_bwd(g, OP_ATTENTION_BWD), 1);
    assert_int_equal(count_bwd(g, OP_PART), 2);
    assert_int_equal(dq->op, OP_PART);
    assert_int_equal(dk->op, OP_PART);
    assert_ptr_equal(dq->in[0], dk->in[0]);
    const IrNode *bwd = dq->in[0];
    assert_int_equal(bwd->op, OP_ATTENTION_BWD);
    assert_ptr_equal(bwd->in[3], y); /* the forward's result */
    assert_int_equal(bwd->attr.causal, 1);
    assert_true(bwd->attr.attn_scale == 0.5);
    assert_int_equal(dq->attr.part, 0);
    assert_int_equal(dk->attr.part, ir_numel(&sq));
    /* dq, dk, dv, then the log-sum-exp and delta of each of the 2 * 3 * 5 query rows */
    assert_int_equal(ir_numel(&bwd->shape), ir_numel(&sq) + ir_numel(&sk) + ir_numel(&sv) + 2 * 30);
}

/* A mask that depends on a trainable parameter would need a gradient: an error, no graph. */
static void test_attention_mask_gradient(void **state) {
    IrGraph *g = graph(state);
    IrShape s = ir_shape(3, (int64_t)2, (int64_t)5, (int64_t)4);
    IrNode *q = param(g, "q", s), *m = param(g, "m", ir_shape(2, (int64_t)5, (int64_t)5));
    IrNode *y = ir_add(g, OP_ATTENTION_MASKED, s, DT_F32, loc, 3, q, q, q);
    y->in[3] = m, y->n_in = 4, y->attr.attn_scale = 0.5;
    g->loss = mean(g, y);
    assert_int_not_equal(ad_differentiate(g), 0);
}

/* The same mask frozen: q's gradient through attention_masked_bwd, which reads the mask. */
static void test_attention_frozen_mask(void **state) {
    IrGraph *g = graph(state);
    IrShape s = ir_shape(3, (int64_t)2, (int64_t)5, (int64_t)4);
    IrNode *q = param(g, "q", s), *m = param(g, "m", ir_shape(2, (int64_t)5, (int64_t)5));
    g->params[1].trainable = 0;
    IrNode *y = ir_add(g, OP_ATTENTION_MASKED, s, DT_F32, loc, 3, q, q, q);
    y->in[3] = m, y->n_in = 4, y->attr.attn_scale = 0.5;
    differentiate(g, mean(g, y));
    assert_int_equal(count_bwd(g, OP_ATTENTION_MASKED_BWD), 1);
    assert_int_equal(count_bwd(g, OP_PART), 3); /* q is q, k and v: three contributions */
    assert_int_equal(g->params[0].grad->op, OP_ADD);
}

/* Each backward node points at the .net line of the forward node it differentiates. */
static void test_locations(void **state) {
    IrGraph *g = graph(state);
    IrNode *p = param(g, "p", s1(8));
    IrNode *t = ew(g, OP_TANH, p, NULL);
    t->loc.line = 7;
    IrNode *loss = mean(g, t);
    loss->loc.line = 9;
    differentiate(g, loss);
    assert_int_equal(g->params[0].grad->op, OP_TANH_GRAD);
    assert_int_equal(g->params[0].grad->loc.line, 7);
    assert_int_equal(g->nodes[g->n_fwd]->loc.line, 9);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_accumulation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frozen_param, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unused_param, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loss_without_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_nn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_nt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_tn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_tt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_batched_nn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_batched_tt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broadcast_add, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broadcast_mul_div, setup, teardown),
        cmocka_unit_test_setup_teardown(test_integer_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv2d, setup, teardown),
        cmocka_unit_test_setup_teardown(test_locations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attention, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attention_mask_gradient, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attention_frozen_mask, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
