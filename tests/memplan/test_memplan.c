/* test_memplan.c - the memory plan's guarantees, checked on small graphs built with ir.h, and
 * the CPU backend's output for them compiled with the warnings CI uses.
 *
 * Every plan is checked in full by check_plan(): no two arena buffers whose lifetimes overlap
 * share a byte (every pair) unless one is written in place over the other, every arena offset is 64-byte aligned and inside the arena, the
 * arena is no larger than the sum of its buffers, views alias a real buffer that lives as long
 * as every read through them, parameters are packed trainable-first with grad_offset == offset.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codegen.h"
#include "netrt.h"
#include "passes.h"

#define DIMS(...) ir_shape(__VA_ARGS__)
#define D(x) ((int64_t)(x))

static const SrcLoc here = {"test.net", 1, 1};

static int64_t bytes_of(const IrNode *n) { return ir_numel(&n->shape) * ir_dtype_size(n->dtype); }

static const IrNode *root_of(const IrNode *n) {
    while (n->storage == ST_ALIAS) n = n->in[0];
    return n;
}

/* b's kernel writes its result over a (the CPU target's in_place), which nothing reads after
 * b: then, and only then, the two share all their bytes. */
static int writes_over(const IrNode *b, const IrNode *a) {
    int k = cg_cpu.in_place(b);
    return k >= 0 && root_of(b->in[k]) == a && a->last_use == b->first_use && a->offset == b->offset &&
           bytes_of(a) == bytes_of(b);
}

static void check_arena(const IrGraph *g) {
    int64_t sum = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *a = g->nodes[i];
        if (a->storage != ST_ARENA) continue;
        assert_int_equal(a->offset % 64, 0);
        assert_true(a->offset >= 0 && a->offset + bytes_of(a) <= g->arena_bytes);
        assert_int_equal(a->first_use, i);
        assert_true(a->last_use >= a->first_use);
        sum += bytes_of(a);
        for (int j = i + 1; j < g->n; j++) {
            const IrNode *b = g->nodes[j];
            if (b->storage != ST_ARENA) continue;
            int live_together = a->first_use <= b->last_use && b->first_use <= a->last_use;
            int share = a->offset < b->offset + bytes_of(b) && b->offset < a->offset + bytes_of(a);
            if (live_together && share && !writes_over(b, a))
                fail_msg("%%%d [%d,%d] and %%%d [%d,%d] share bytes", a->id, a->first_use, a->last_use,
                         b->id, b->first_use, b->last_use);
        }
    }
    assert_true(sum <= g->unplanned_bytes);
    assert_true(g->arena_bytes <= g->unplanned_bytes);
}

/* Every read, direct or through views, happens while the storage it reads is live. */
static void check_lifetimes(const IrGraph *g) {
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        assert_int_not_equal(n->storage, ST_NONE);
        if (ir_op_kind(n->op) == OPK_VIEW && n->storage != ST_INLINE) { /* inline: a view of a constant */
            assert_int_equal(n->storage, ST_ALIAS);
            assert_int_not_equal(root_of(n)->storage, ST_ALIAS);
        }
        if (n->op == OP_INPUT) assert_int_equal(n->storage, ST_INPUT);
        if (n->op == OP_CONST) assert_int_equal(n->storage, ST_INLINE);
        for (int k = 0; k < n->n_in; k++) {
            const IrNode *r = root_of(n->in[k]);
            if (r->storage == ST_ARENA) assert_true(r->last_use >= i);
        }
    }
    if (g->loss && root_of(g->loss)->storage == ST_ARENA) assert_true(root_of(g->loss)->last_use >= g->n - 1);
    if (g->correct && root_of(g->correct)->storage == ST_ARENA)
        assert_true(root_of(g->correct)->last_use >= g->n - 1);
}

static void check_params(const IrGraph *g) {
    int64_t trainable = 0, all = 0, max_trainable_end = 0, min_frozen = INT64_MAX;
    for (int i = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        int64_t n = ir_numel(&p->node->shape);
        assert_int_equal(p->node->storage, ST_PARAM);
        assert_int_equal(p->node->offset, p->offset);
        all += n;
        if (p->trainable) {
            trainable += n;
            assert_int_equal(p->grad_offset, p->offset);
            if (p->offset + n > max_trainable_end) max_trainable_end = p->offset + n;
            if (p->grad && root_of(p->grad)->storage == ST_GRAD)
                assert_int_equal(root_of(p->grad)->offset, p->grad_offset);
        } else {
            assert_int_equal(p->grad_offset, -1);
            if (p->offset < min_frozen) min_frozen = p->offset;
        }
    }
    assert_int_equal(g->n_param_floats, all);
    assert_int_equal(g->n_grad_floats, trainable);
    assert_int_equal(max_trainable_end, trainable);
    if (min_frozen != INT64_MAX) assert_true(min_frozen >= trainable);
    /* no two parameters overlap: offsets in declaration order within each group */
    for (int i = 0; i < g->n_params; i++)
        for (int j = i + 1; j < g->n_params; j++) {
            const IrParam *a = &g->params[i], *b = &g->params[j];
            assert_true(a->offset + ir_numel(&a->node->shape) <= b->offset ||
                        b->offset + ir_numel(&b->node->shape) <= a->offset);
        }
}

static void check_plan(const IrGraph *g) {
    check_arena(g);
    check_lifetimes(g);
    check_params(g);
}

/* ---- graphs */

/* input [4,6] -> matmul with w [3,6]^T -> + b [3] -> relu -> xent against i64 labels -> mean */
static IrGraph *mlp(Arena *arena, int with_backward) {
    IrGraph *g = ir_graph_new(arena);
    g->model_name = "mlp";
    g->source_path = "test.net";
    g->batch = 4;
    IrNode *x = ir_add_input(g, "x", DIMS(2, D(4), D(6)), DT_F32, here);
    IrNode *label = ir_add_input(g, "label", DIMS(1, D(4)), DT_I64, here);
    IrParam *frozen = ir_add_param(g, "embed.scale", DIMS(1, D(6)), INIT_ONES, 0, here);
    frozen->trainable = 0;
    IrParam *w = ir_add_param(g, "fc.weight", DIMS(2, D(3), D(6)), INIT_UNIFORM, 0.4, here);
    IrParam *b = ir_add_param(g, "fc.bias", DIMS(1, D(3)), INIT_ZEROS, 0, here);
    IrNode *h = ir_add(g, OP_MUL, x->shape, DT_F32, here, 2, x, frozen->node);
    h = ir_add(g, OP_MATMUL, DIMS(2, D(4), D(3)), DT_F32, here, 2, h, w->node);
    h->attr.trans_b = 1;
    h = ir_add(g, OP_ADD, h->shape, DT_F32, here, 2, h, b->node);
    IrNode *logits = ir_add(g, OP_RELU, h->shape, DT_F32, here, 1, h);
    IrNode *xent = ir_add(g, OP_XENT, DIMS(1, D(4)), DT_F32, here, 2, logits, label);
    g->loss = ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, here, 1, xent);
    g->loss->attr.batch_masked = 1;
    g->correct = ir_add(g, OP_ACCURACY, ir_scalar_shape(), DT_F32, here, 2, logits, label);
    assert_true(ir_verify(g, "test"));
    if (with_backward) assert_int_equal(ad_differentiate(g), 0);
    else g->n_fwd = g->n;
    return g;
}

static void test_mlp_forward_only(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = mlp(&arena, 0);
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    check_plan(g);
    arena_free(&arena);
}

static void test_mlp_with_backward(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = mlp(&arena, 1);
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    check_plan(g);
    /* the weight's and bias's gradients are computed straight into the gradient buffer */
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].trainable) assert_int_equal(g->params[i].grad->storage, ST_GRAD);
    /* planning twice gives the same plan */
    int64_t arena_bytes = g->arena_bytes;
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    assert_int_equal(g->arena_bytes, arena_bytes);
    check_plan(g);
    arena_free(&arena);
}

/* x -> 10 element-wise ops in a chain, each value dead after its one reader: two or three
 * buffers' worth of arena should hold them all. */
static void test_chain_reuses_memory(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = ir_graph_new(&arena);
    g->batch = 8;
    IrNode *x = ir_add_input(g, "x", DIMS(2, D(8), D(100)), DT_F32, here);
    for (int i = 0; i < 10; i++) x = ir_add(g, i % 2 ? OP_TANH : OP_EXP, x->shape, DT_F32, here, 1, x);
    g->loss = ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, here, 1, x);
    g->n_fwd = g->n;
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    check_plan(g);
    assert_true(g->arena_bytes < g->unplanned_bytes);
    assert_true(g->arena_bytes <= 3 * 3200 + 64);
    arena_free(&arena);
}

/* A deep chain with its backward pass and widths that change at matrix products: more arena
 * buffers than the best fit handles (memplan.c: BEST_FIT_MAX), so the plan is made in schedule
 * order; it must still keep every pair of buffers that live together apart, and reuse memory. */
static void test_large_graph_in_order(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = ir_graph_new(&arena);
    g->model_name = "deep";
    g->batch = 8;
    IrNode *x = ir_add_input(g, "x", DIMS(2, D(8), D(100)), DT_F32, here);
    for (int i = 0; i < 2400; i++) {
        if (i % 10 == 9) { /* 100 -> 37 -> 100 wide */
            int64_t out = x->shape.dim[1] == 100 ? 37 : 100;
            IrParam *w = ir_add_param(g, arena_printf(&arena, "fc%d.weight", i), DIMS(2, D(out), x->shape.dim[1]),
                                      INIT_UNIFORM, 0.1, here);
            x = ir_add(g, OP_MATMUL, DIMS(2, D(8), D(out)), DT_F32, here, 2, x, w->node);
            x->attr.trans_b = 1;
        } else {
            x = ir_add(g, i % 2 ? OP_TANH : OP_SIGMOID, x->shape, DT_F32, here, 1, x);
        }
    }
    g->loss = ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, here, 1, x);
    assert_true(ir_verify(g, "test"));
    assert_int_equal(ad_differentiate(g), 0);
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    int buffers = 0;
    for (int i = 0; i < g->n; i++) buffers += g->nodes[i]->storage == ST_ARENA;
    assert_true(buffers > 4096);
    check_plan(g);
    assert_true(g->arena_bytes < g->unplanned_bytes / 2);
    arena_free(&arena);
}

/* A view keeps its root alive until the view's last reader. */
static void test_view_extends_root(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = ir_graph_new(&arena);
    g->batch = 4;
    IrNode *x = ir_add_input(g, "x", DIMS(2, D(4), D(16)), DT_F32, here);
    IrNode *a = ir_add(g, OP_EXP, x->shape, DT_F32, here, 1, x);        /* root */
    IrNode *v = ir_add(g, OP_RESHAPE, DIMS(1, D(64)), DT_F32, here, 1, a); /* view of a */
    IrNode *b = ir_add(g, OP_EXP, x->shape, DT_F32, here, 1, x);        /* must not take a's bytes */
    IrNode *c = ir_add(g, OP_RESHAPE, DIMS(1, D(64)), DT_F32, here, 1, b);
    IrNode *d = ir_add(g, OP_ADD, v->shape, DT_F32, here, 2, v, c);     /* reads a through v */
    g->loss = ir_add(g, OP_SUM, ir_scalar_shape(), DT_F32, here, 1, d);
    g->n_fwd = g->n;
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    check_plan(g);
    assert_int_equal(v->storage, ST_ALIAS);
    assert_int_equal(a->storage, ST_ARENA);
    assert_true(a->last_use >= d->id);
    assert_true(a->offset != b->offset);
    arena_free(&arena);
}

/* Frozen parameters declared first still go after the trainable ones; an unused trainable
 * parameter gets a zero gradient; the gradient of a parameter used through a view is a view
 * of a backward node, and that node is placed in the gradient buffer. */
static void test_param_order_and_grads(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = ir_graph_new(&arena);
    g->batch = 2;
    IrParam *f1 = ir_add_param(g, "frozen.a", DIMS(1, D(5)), INIT_ONES, 0, here);
    IrParam *t1 = ir_add_param(g, "w", DIMS(2, D(2), D(3)), INIT_NORMAL, 1, here);
    IrParam *f2 = ir_add_param(g, "frozen.b", DIMS(1, D(3)), INIT_ZEROS, 0, here);
    IrParam *t2 = ir_add_param(g, "unused", DIMS(1, D(4)), INIT_ZEROS, 0, here);
    IrParam *t3 = ir_add_param(g, "viewed", DIMS(2, D(2), D(3)), INIT_ZEROS, 0, here);
    f1->trainable = f2->trainable = 0;
    IrNode *x = ir_add_input(g, "x", DIMS(2, D(2), D(3)), DT_F32, here);
    IrNode *h = ir_add(g, OP_MUL, x->shape, DT_F32, here, 2, x, t1->node);
    h = ir_add(g, OP_ADD, h->shape, DT_F32, here, 2, h, f2->node);
    IrNode *flat = ir_add(g, OP_RESHAPE, DIMS(1, D(6)), DT_F32, here, 1, t3->node);
    IrNode *r = ir_add(g, OP_RESHAPE, DIMS(1, D(6)), DT_F32, here, 1, h);
    h = ir_add(g, OP_MUL, r->shape, DT_F32, here, 2, r, flat);
    g->loss = ir_add(g, OP_SUM, ir_scalar_shape(), DT_F32, here, 1, h);
    assert_true(ir_verify(g, "test"));
    assert_int_equal(ad_differentiate(g), 0);
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    check_plan(g);
    assert_int_equal(t1->offset, 0);
    assert_int_equal(t2->offset, 6);
    assert_int_equal(t3->offset, 10);
    assert_int_equal(f1->offset, 16);
    assert_int_equal(f2->offset, 21);
    assert_int_equal(g->n_grad_floats, 16);
    assert_int_equal(g->n_param_floats, 24);
    assert_non_null(t2->grad);
    assert_null(f1->grad);
    /* t3's gradient is a reshape of a backward MUL: the MUL is computed in the gradient buffer */
    assert_int_equal(t3->grad->storage, ST_ALIAS);
    assert_int_equal(root_of(t3->grad)->storage, ST_GRAD);
    assert_int_equal(root_of(t3->grad)->offset, t3->grad_offset);
    arena_free(&arena);
}

/* conv -> maxpool -> flatten -> loss: scratch is sized by the runtime's own formula. */
static IrGraph *convnet(Arena *arena) {
    IrGraph *g = ir_graph_new(arena);
    g->model_name = "convnet";
    g->source_path = "test.net";
    g->batch = 2;
    IrNode *x = ir_add_input(g, "image", DIMS(4, D(2), D(3), D(8), D(8)), DT_U8, here);
    IrNode *label = ir_add_input(g, "label", DIMS(1, D(2)), DT_I64, here);
    IrParam *w = ir_add_param(g, "conv.weight", DIMS(4, D(4), D(3), D(3), D(3)), INIT_UNIFORM, 0.2, here);
    IrParam *b = ir_add_param(g, "conv.bias", DIMS(1, D(4)), INIT_ZEROS, 0, here);
    IrNode *h = ir_add(g, OP_CAST, x->shape, DT_F32, here, 1, x);
    h = ir_add(g, OP_MUL, h->shape, DT_F32, here, 2, h, ir_const(g, 1.0 / 255, DT_F32, here));
    h = ir_add(g, OP_CONV2D, DIMS(4, D(2), D(4), D(6), D(6)), DT_F32, here, 2, h, w->node);
    h->attr.stride[0] = h->attr.stride[1] = h->attr.dil[0] = h->attr.dil[1] = 1;
    /* the bias is read through a view, as dense and conv2d layers do: its pointer is unused */
    IrNode *bias = ir_add(g, OP_RESHAPE, DIMS(3, D(4), D(1), D(1)), DT_F32, here, 1, b->node);
    h = ir_add(g, OP_ADD, h->shape, DT_F32, here, 2, h, bias);
    h = ir_add(g, OP_TANH, h->shape, DT_F32, here, 1, h);
    h = ir_add(g, OP_MAXPOOL2D, DIMS(4, D(2), D(4), D(3), D(3)), DT_F32, here, 1, h);
    h->attr.kernel[0] = h->attr.kernel[1] = h->attr.stride[0] = h->attr.stride[1] = 2;
    h = ir_add(g, OP_RESHAPE, DIMS(2, D(2), D(36)), DT_F32, here, 1, h);
    h = ir_add(g, OP_DROPOUT, h->shape, DT_F32, here, 1, h);
    h->attr.p = 0.5;
    h->attr.seed_id = g->n_dropout++;
    IrNode *xent = ir_add(g, OP_XENT, DIMS(1, D(2)), DT_F32, here, 2, h, label);
    g->loss = ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, here, 1, xent);
    g->loss->attr.batch_masked = 1;
    g->train.optim = RT_OPTIM_ADAMW;
    g->train.hyper.weight_decay = 0.01;
    assert_true(ir_verify(g, "test"));
    assert_int_equal(ad_differentiate(g), 0);
    return g;
}

static void test_conv_scratch(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = convnet(&arena);
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    check_plan(g);
    RtConv c = {.N = 2, .C = 3, .H = 8, .W = 8, .K = 4, .R = 3, .S = 3, .P = 6, .Q = 6, .groups = 1};
    assert_int_equal(g->scratch_per_thread, rt_conv2d_scratch(&c));
    arena_free(&arena);
}

static char *print_plan(const IrGraph *g) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mp_print(g, f);
    fclose(f);
    return text;
}

/* A classifier: x [8,16] @ w [32,16]^T -> logits [8,32] -> xent -> mean, with an accuracy
 * that reads the logits in the forward pass. */
static IrGraph *classifier(Arena *arena) {
    IrGraph *g = ir_graph_new(arena);
    g->model_name = "classifier";
    g->source_path = "test.net";
    g->batch = 8;
    IrNode *x = ir_add_input(g, "x", DIMS(2, D(8), D(16)), DT_F32, here);
    IrNode *label = ir_add_input(g, "label", DIMS(1, D(8)), DT_I64, here);
    IrParam *w = ir_add_param(g, "fc.weight", DIMS(2, D(32), D(16)), INIT_UNIFORM, 0.25, here);
    IrNode *logits = ir_add(g, OP_MATMUL, DIMS(2, D(8), D(32)), DT_F32, here, 2, x, w->node);
    logits->attr.trans_b = 1;
    IrNode *xent = ir_add(g, OP_XENT, DIMS(1, D(8)), DT_F32, here, 2, logits, label);
    g->loss = ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, here, 1, xent);
    g->loss->attr.batch_masked = 1;
    g->correct = ir_add(g, OP_ACCURACY, ir_scalar_shape(), DT_F32, here, 2, logits, label);
    assert_int_equal(ad_differentiate(g), 0);
    return g;
}

static IrNode *find_op(const IrGraph *g, IrOp op) {
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->op == op) return g->nodes[i];
    fail_msg("no %s in the graph", ir_op_name(op));
    return NULL;
}

/* The CPU's cross-entropy gradient takes the logits' buffer: nothing reads the logits after it
 * (the accuracy reads them in the forward pass), and the plan shrinks. */
static void test_xent_grad_in_place(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = classifier(&arena);
    mp_plan(g, cg_cpu.node_scratch, NULL);
    check_plan(g);
    int64_t apart = g->arena_bytes;
    IrNode *bwd = find_op(g, OP_XENT_BWD), *logits = bwd->in[0];
    assert_int_not_equal(bwd->offset, logits->offset);
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    check_plan(g);
    assert_int_equal(logits->storage, ST_ARENA);
    assert_int_equal(bwd->offset, logits->offset);
    assert_true(g->arena_bytes < apart);
    arena_free(&arena);
}

/* The rule itself, for a target that lets exp and expand write over their operand: taken
 * through a reshape when nothing reads the operand later; refused when something does (here a
 * metric read after the exp), when the operand is an input, or when its size differs. */
static int exp_in_place(const IrNode *n) { return n->op == OP_EXP || n->op == OP_EXPAND ? 0 : -1; }

static void test_in_place_rule(void **state) {
    (void)state;
    for (int c = 0; c < 4; c++) { /* 0: taken, 1: read later, 2: an input, 3: another size */
        Arena arena = {0};
        IrGraph *g = ir_graph_new(&arena);
        g->model_name = "rule";
        g->source_path = "test.net";
        g->batch = 8;
        IrNode *x = ir_add_input(g, "x", DIMS(2, D(8), D(32)), DT_F32, here);
        IrNode *a = c == 2 ? x : ir_add(g, OP_RELU, x->shape, DT_F32, here, 1, x);
        IrNode *r = ir_add(g, OP_RESHAPE, DIMS(1, D(256)), DT_F32, here, 1, a);
        IrNode *b = c == 3 ? ir_add(g, OP_EXPAND, DIMS(2, D(2), D(256)), DT_F32, here, 1, r)
                           : ir_add(g, OP_EXP, r->shape, DT_F32, here, 1, r);
        g->loss = ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, here, 1, b);
        if (c == 1) g->correct = ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, here, 1, a);
        assert_true(ir_verify(g, "test"));
        g->n_fwd = g->n;
        mp_plan(g, NULL, exp_in_place);
        assert_int_equal(b->storage, ST_ARENA);
        if (c == 0) assert_int_equal(b->offset, a->offset);
        else if (a->storage == ST_ARENA) assert_int_not_equal(b->offset, a->offset);
        /* the pair shares bytes only when taken; every other pair never */
        for (int i = 0; i < g->n; i++)
            for (int j = i + 1; j < g->n; j++) {
                const IrNode *p = g->nodes[i], *q = g->nodes[j];
                if (p->storage != ST_ARENA || q->storage != ST_ARENA) continue;
                int live = p->first_use <= q->last_use && q->first_use <= p->last_use;
                int share = p->offset < q->offset + bytes_of(q) && q->offset < p->offset + bytes_of(p);
                if (live && share) assert_true(c == 0 && p == a && q == b);
            }
        arena_free(&arena);
    }
}

static void test_print_is_stable(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = mlp(&arena, 1);
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    char *first = print_plan(g);
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    char *second = print_plan(g);
    assert_string_equal(first, second);
    assert_non_null(strstr(first, "arena: "));
    assert_non_null(strstr(first, "without reuse"));
    free(first);
    free(second);
    arena_free(&arena);
}

/* ---- the CPU backend's output compiles with the warnings CI uses */

static void compile_emitted(IrGraph *g, const char *name) {
    char path[256], cmd[1024];
    snprintf(path, sizeof path, "%s/%s.c", NETC_TEST_WORK_DIR, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(cg_emit(&cg_cpu, g, f, NULL), 0);
    assert_int_equal(fclose(f), 0);
    snprintf(cmd, sizeof cmd,
             "'%s' -std=c11 -O2 -fopenmp -Wall -Wextra -Wpedantic -Werror -I '%s' -c '%s' -o '%s/%s.o'",
             NETC_TEST_CC, NETC_TEST_RUNTIME_DIR, path, NETC_TEST_WORK_DIR, name);
    if (system(cmd) != 0) fail_msg("the generated %s does not compile: %s", path, cmd);
}

static void test_emitted_mlp_compiles(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = mlp(&arena, 1);
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    compile_emitted(g, "emit_mlp");
    arena_free(&arena);
}

static void test_emitted_convnet_compiles(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = convnet(&arena);
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    compile_emitted(g, "emit_convnet");
    arena_free(&arena);
}

static char *emit_text(const IrGraph *g) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_int_equal(cg_emit(&cg_cpu, g, f, NULL), 0);
    fclose(f);
    return text;
}

/* Broadcast operands index with folded constants, in loops of rows of the innermost axis (a
 * broadcast operand makes them two-level however short it is): a per-channel bias over NCHW
 * reads `(r / H) % C` in rows of W; over a channels-last output it reads `[c]` in rows of C;
 * same-shape operands `[i]`, and a row-major value read in channels-last order its permuted index. */
static void test_broadcast_index_folding(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = ir_graph_new(&arena);
    g->model_name = "bcast";
    g->batch = 2;
    IrNode *x = ir_add_input(g, "x", DIMS(4, D(2), D(3), D(4), D(5)), DT_F32, here);
    IrParam *b = ir_add_param(g, "b", DIMS(3, D(3), D(1), D(1)), INIT_ZEROS, 0, here);
    IrNode *nchw = ir_add(g, OP_ADD, x->shape, DT_F32, here, 2, x, b->node);
    IrNode *cl = ir_add(g, OP_EXP, x->shape, DT_F32, here, 1, nchw);
    cl->layout = LAYOUT_NHWC; /* as a channels-last pass would mark it */
    IrNode *nhwc = ir_add(g, OP_ADD, x->shape, DT_F32, here, 2, cl, b->node);
    nhwc->layout = LAYOUT_NHWC;
    IrNode *sum = ir_add(g, OP_ADD, x->shape, DT_F32, here, 2, nhwc, nchw);
    sum->layout = LAYOUT_NHWC;
    g->loss = ir_add(g, OP_SUM, ir_scalar_shape(), DT_F32, here, 1, sum);
    g->n_fwd = g->n;
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    char *c = emit_text(g);
    char want[128];
    snprintf(want, sizeof want, "for (int64_t c = 0; c < 5; c++) {");
    assert_non_null(strstr(c, want));
    snprintf(want, sizeof want, "v%d[i] = v%d[i] + v%d[r / 4 %% 3];", nchw->id, x->id, b->node->id);
    assert_non_null(strstr(c, want));
    snprintf(want, sizeof want, "v%d[i] = v%d[i] + v%d[c];", nhwc->id, cl->id, b->node->id);
    assert_non_null(strstr(c, want));
    /* row-major nchw read in channels-last order: c is innermost, then (h, w), then n */
    snprintf(want, sizeof want, "v%d[(i %% 3) * 20 + i / 3 %% 20 + (i / 60) * 60]", nchw->id);
    assert_non_null(strstr(c, want));
    free(c);
    arena_free(&arena);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_forward_only),
        cmocka_unit_test(test_mlp_with_backward),
        cmocka_unit_test(test_chain_reuses_memory),
        cmocka_unit_test(test_large_graph_in_order),
        cmocka_unit_test(test_view_extends_root),
        cmocka_unit_test(test_param_order_and_grads),
        cmocka_unit_test(test_conv_scratch),
        cmocka_unit_test(test_xent_grad_in_place),
        cmocka_unit_test(test_in_place_rule),
        cmocka_unit_test(test_print_is_stable),
        cmocka_unit_test(test_emitted_mlp_compiles),
        cmocka_unit_test(test_emitted_convnet_compiles),
        cmocka_unit_test(test_broadcast_index_folding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
