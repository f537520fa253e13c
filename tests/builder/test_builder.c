/* test_builder.c - the graph builder's edits on small differentiated graphs.
 *
 * Each test opens a builder on y = relu(x * w), loss = mean(y) after autodiff, edits it and
 * checks what a pass relies on: a node inserted before or after another joins that node's part
 * of the schedule (so n_fwd moves only for forward insertions, also at the boundary between the
 * parts), ids are schedule positions again after irb_finish, use-lists follow every operand
 * change, replacing uses rewrites exactly the readings asked for (the graph's own references
 * included), and the verifier accepts the result.
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
    IrNode *x, *w, *prod, *y; /* the forward nodes */
} Fixture;

/* y = relu(x * w), loss = mean(y), differentiated: w gets a gradient. */
static int setup(void **state) {
    Fixture *f = xcalloc(1, sizeof *f);
    IrGraph *g = f->g = ir_graph_new(&f->arena);
    g->model_name = "test";
    g->batch = 4;
    IrShape s = ir_shape(2, (int64_t)4, (int64_t)8);
    f->x = ir_add_input(g, "x", s, DT_F32, loc);
    f->w = ir_add_param(g, "w", s, INIT_NORMAL, 1.0, loc)->node;
    f->prod = ir_add(g, OP_MUL, s, DT_F32, loc, 2, f->x, f->w);
    f->y = ir_add(g, OP_RELU, s, DT_F32, loc, 1, f->prod);
    g->loss = ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, loc, 1, f->y);
    assert_int_equal(ad_differentiate(g), 0);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    Fixture *f = *state;
    arena_free(&f->arena);
    free(f);
    return 0;
}

/* What holds after every edit: ids are positions, each node's phase is its part's, the
 * verifier accepts the graph. */
static void check_graph(const IrGraph *g) {
    for (int i = 0; i < g->n; i++) {
        assert_int_equal(g->nodes[i]->id, i);
        assert_int_equal(g->nodes[i]->phase, i < g->n_fwd ? PHASE_FWD : PHASE_BWD);
    }
    assert_true(ir_verify(g, "builder test"));
}

/* How many operand slots of the schedule read x. */
static int readings(const IrGraph *g, const IrNode *x) {
    int c = 0;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) c += g->nodes[i]->in[k] == x;
    return c;
}

/* x's use-list holds exactly the operand slots that read it. */
static void check_uses(const IrBuilder *b, const IrNode *x, int expected) {
    int n_uses;
    const IrUse *use = irb_uses(b, x, &n_uses);
    assert_int_equal(n_uses, expected);
    for (int i = 0; i < n_uses; i++) assert_ptr_equal(use[i].user->in[use[i].k], x);
}

static void test_insert_forward(void **state) {
    Fixture *f = *state;
    IrGraph *g = f->g;
    int n = g->n, n_fwd = g->n_fwd;
    IrBuilder *b = irb_begin(g);
    IrNode *before = irb_unary(b, OP_CAST, f->x, DT_BF16, LAYOUT_ROW_MAJOR, f->prod);
    IrNode *after = irb_unary(b, OP_NEG, f->prod, DT_F32, LAYOUT_ROW_MAJOR, f->prod);
    irb_insert_before(b, f->prod, before);
    irb_insert_after(b, f->prod, after);
    assert_true(irb_placed(b, before) && irb_placed(b, after));
    assert_int_equal(irb_finish(b), 2);
    assert_int_equal(g->n, n + 2);
    assert_int_equal(g->n_fwd, n_fwd + 2);
    assert_int_equal(before->id + 1, f->prod->id);
    assert_int_equal(after->id, f->prod->id + 1);
    assert_int_equal(f->y->id, after->id + 1);
    assert_int_equal(before->loc.line, f->prod->loc.line);
    check_graph(g);
}

/* At the boundary: after the last forward node is forward, before the first backward node is
 * backward, and an appended node ends the backward part. */
static void test_insert_at_boundary(void **state) {
    Fixture *f = *state;
    IrGraph *g = f->g;
    int n = g->n, n_fwd = g->n_fwd;
    IrNode *last_fwd = g->nodes[n_fwd - 1], *first_bwd = g->nodes[n_fwd], *last = g->nodes[n - 1];
    IrBuilder *b = irb_begin(g);
    IrNode *fwd = irb_unary(b, OP_NEG, last_fwd, DT_F32, LAYOUT_ROW_MAJOR, last_fwd);
    IrNode *bwd = irb_unary(b, OP_NEG, last_fwd, DT_F32, LAYOUT_ROW_MAJOR, first_bwd);
    IrNode *end = irb_unary(b, OP_NEG, last, DT_F32, LAYOUT_ROW_MAJOR, last);
    irb_insert_before(b, first_bwd, bwd);
    irb_insert_after(b, last_fwd, fwd);
    irb_append(b, end);
    assert_int_equal(g->n, n); /* the graph changes only at irb_finish */
    assert_int_equal(irb_finish(b), 3);
    assert_int_equal(g->n, n + 3);
    assert_int_equal(g->n_fwd, n_fwd + 1);
    assert_ptr_equal(g->nodes[g->n_fwd - 1], fwd);
    assert_ptr_equal(g->nodes[g->n_fwd], bwd);
    assert_ptr_equal(g->nodes[g->n_fwd + 1], first_bwd);
    assert_ptr_equal(g->nodes[g->n - 1], end);
    check_graph(g);
}

/* Every reading of prod moves to its copy; the copy itself still reads prod. */
static void test_replace_all_uses(void **state) {
    Fixture *f = *state;
    IrGraph *g = f->g;
    int old_readings = readings(g, f->prod);
    IrBuilder *b = irb_begin(g);
    check_uses(b, f->prod, old_readings);
    IrNode *copy = irb_unary(b, OP_CAST, f->prod, DT_F32, LAYOUT_ROW_MAJOR, f->prod);
    irb_insert_after(b, f->prod, copy);
    assert_int_equal(irb_replace_uses(b, f->prod, copy, NULL, NULL), old_readings);
    check_uses(b, f->prod, 1);
    check_uses(b, copy, old_readings);
    assert_ptr_equal(f->y->in[0], copy);
    irb_finish(b);
    assert_int_equal(readings(g, f->prod), 1);
    assert_int_equal(readings(g, copy), old_readings);
    check_graph(g);
}

static int backward_reader(const IrNode *user, const void *ctx) {
    (void)ctx;
    return user && user->phase == PHASE_BWD;
}

/* Only the readings the filter accepts: x's backward readers read a copy made at the start of
 * the backward part, the forward product still reads x. */
static void test_replace_some_uses(void **state) {
    Fixture *f = *state;
    IrGraph *g = f->g;
    int n_fwd = g->n_fwd, all = readings(g, f->x);
    IrNode *first_bwd = g->nodes[n_fwd];
    IrBuilder *b = irb_begin(g);
    IrNode *copy = irb_unary(b, OP_CAST, f->x, DT_F32, LAYOUT_ROW_MAJOR, first_bwd);
    irb_insert_before(b, first_bwd, copy);
    int moved = irb_replace_uses(b, f->x, copy, backward_reader, NULL);
    assert_true(moved >= 1);
    check_uses(b, f->x, all - moved + 1);
    check_uses(b, copy, moved);
    assert_ptr_equal(f->prod->in[0], f->x);
    irb_finish(b);
    assert_int_equal(g->n_fwd, n_fwd);
    for (int i = g->n_fwd; i < g->n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            if (g->nodes[i] != copy) assert_ptr_not_equal(g->nodes[i]->in[k], f->x);
    check_graph(g);
}

static int graph_reference(const IrNode *user, const void *ctx) {
    (void)ctx;
    return user == NULL;
}

/* The graph's own references: the parameter's gradient becomes the node computed after it,
 * and no node's operand changes. */
static void test_replace_result(void **state) {
    Fixture *f = *state;
    IrGraph *g = f->g;
    IrNode *grad = g->params[0].grad;
    int old_readings = readings(g, grad);
    IrBuilder *b = irb_begin(g);
    assert_true(irb_is_result(b, grad));
    IrNode *copy = irb_unary(b, OP_CAST, grad, DT_F32, LAYOUT_ROW_MAJOR, grad);
    irb_insert_after(b, grad, copy);
    assert_int_equal(irb_replace_uses(b, grad, copy, graph_reference, NULL), 1);
    assert_ptr_equal(g->params[0].grad, copy);
    assert_false(irb_is_result(b, grad));
    irb_finish(b);
    assert_int_equal(readings(g, grad), old_readings + 1);
    check_graph(g);
}

/* One operand: both use-lists follow. */
static void test_set_operand(void **state) {
    Fixture *f = *state;
    IrGraph *g = f->g;
    IrBuilder *b = irb_begin(g);
    int n_uses;
    irb_uses(b, f->prod, &n_uses);
    IrNode *neg = irb_unary(b, OP_NEG, f->prod, DT_F32, LAYOUT_ROW_MAJOR, f->y);
    irb_insert_before(b, f->y, neg);
    irb_set_operand(b, f->y, 0, neg);
    check_uses(b, f->prod, n_uses); /* neg's reading came, y's left */
    check_uses(b, neg, 1);
    irb_finish(b);
    assert_ptr_equal(f->y->in[0], neg);
    check_graph(g);
}

/* A node replaced by a new one and removed: it leaves the schedule and its operands' use-lists,
 * and the graph keeps its size (ignored_rows.c replaces products this way). */
static void test_remove(void **state) {
    Fixture *f = *state;
    IrGraph *g = f->g;
    int n = g->n, n_fwd = g->n_fwd, x_readings = readings(g, f->x), w_readings = readings(g, f->w);
    IrBuilder *b = irb_begin(g);
    IrNode *again = irb_node(b, &(IrNodeSpec){.op = OP_MUL, .n_in = 2, .in = {f->x, f->w}, .shape = f->prod->shape,
                                              .dtype = DT_F32, .phase = PHASE_FWD, .loc = loc});
    irb_insert_before(b, f->prod, again);
    irb_replace_uses(b, f->prod, again, NULL, NULL);
    irb_remove(b, f->prod);
    assert_false(irb_placed(b, f->prod));
    check_uses(b, f->x, x_readings); /* again's reading came, prod's left */
    check_uses(b, f->w, w_readings);
    irb_finish(b);
    assert_int_equal(g->n, n);
    assert_int_equal(g->n_fwd, n_fwd);
    for (int i = 0; i < g->n; i++) assert_ptr_not_equal(g->nodes[i], f->prod);
    assert_int_equal(readings(g, f->x), x_readings);
    check_graph(g);
}

/* A node made and never inserted is not in the graph. */
static void test_unplaced_dropped(void **state) {
    Fixture *f = *state;
    IrGraph *g = f->g;
    int n = g->n;
    IrBuilder *b = irb_begin(g);
    IrNode *spare = irb_unary(b, OP_NEG, f->y, DT_F32, LAYOUT_ROW_MAJOR, f->y);
    assert_false(irb_placed(b, spare));
    assert_int_equal(irb_finish(b), 0);
    assert_int_equal(g->n, n);
    check_graph(g);
}

/* The specification's fields all reach the node; attributes are copied, or default. */
static void test_node_spec(void **state) {
    Fixture *f = *state;
    IrAttrs attr = {.stride = {2, 2}, .groups = 3};
    IrNodeSpec spec = {.op = OP_NEG, .n_in = 1, .in = {f->x}, .shape = f->x->shape, .dtype = DT_F32,
                       .attr = &attr, .phase = PHASE_BWD, .loc = {"a.net", 3, 4}};
    IrNode *n = ir_node_new(f->g, &spec);
    assert_int_equal(n->attr.groups, 3);
    assert_int_equal(n->attr.stride[1], 2);
    assert_int_equal(n->phase, PHASE_BWD);
    assert_int_equal(n->loc.line, 3);
    assert_ptr_equal(n->in[0], f->x);
    spec.attr = NULL;
    assert_int_equal(ir_node_new(f->g, &spec)->attr.groups, 1);
}

/* mean(relu(x @ w)), differentiated; w frozen when asked, and with `other_reader` + mean(-w). */
static IrNode *product_graph(IrGraph *g, int frozen, int other_reader) {
    g->model_name = "mm";
    g->batch = 4;
    IrNode *x = ir_add_input(g, "x", ir_shape(2, (int64_t)4, (int64_t)8), DT_F32, loc);
    IrParam *p = ir_add_param(g, "w", ir_shape(2, (int64_t)8, (int64_t)8), INIT_NORMAL, 1.0, loc);
    p->trainable = !frozen;
    IrNode *mm = ir_add(g, OP_MATMUL, ir_shape(2, (int64_t)4, (int64_t)8), DT_F32, loc, 2, x, p->node);
    IrNode *y = ir_add(g, OP_RELU, mm->shape, DT_F32, loc, 1, mm);
    g->loss = ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, loc, 1, y);
    if (other_reader) {
        IrNode *neg = ir_add(g, OP_NEG, p->node->shape, DT_F32, loc, 1, p->node);
        g->loss = ir_add(g, OP_ADD, ir_scalar_shape(), DT_F32, loc, 2, g->loss,
                         ir_add(g, OP_MEAN, ir_scalar_shape(), DT_F32, loc, 1, neg));
    }
    assert_int_equal(ad_differentiate(g), 0);
    return mm;
}

/* autocast edits through the builder: its forward casts land in the forward part. */
static void test_autocast_parts(void **state) {
    IrGraph *g = ir_graph_new(&((Fixture *)*state)->arena);
    IrNode *mm = product_graph(g, 0, 0);
    int n_fwd = g->n_fwd;
    int added = autocast_half(g, DT_BF16, 1); /* frozen_half: w is trainable, so it does nothing */
    assert_true(added > 0);
    assert_int_equal(g->n_fwd, n_fwd + 3); /* x and w to bf16, the product back to f32 */
    assert_int_equal(mm->dtype, DT_BF16);
    assert_int_equal(mm->in[0]->op, OP_CAST);
    assert_int_equal(mm->in[0]->id, mm->in[0]->in[0]->id + 1); /* right after the value */
    assert_int_equal(g->params[0].node->dtype, DT_F32);
    assert_int_equal(g->params[0].grad->dtype, DT_F32);
    check_graph(g);
}

/* --frozen-half: a frozen weight only products read is itself bf16, read without a cast; one
 * that something else reads too stays float32 behind a cast. */
static void test_autocast_frozen_half(void **state) {
    for (int other = 0; other < 2; other++) {
        IrGraph *g = ir_graph_new(&((Fixture *)*state)->arena);
        IrNode *mm = product_graph(g, 1, other);
        int n_fwd = g->n_fwd;
        autocast_half(g, DT_BF16, 1);
        IrNode *w = g->params[0].node;
        assert_int_equal(w->dtype, other ? DT_F32 : DT_BF16);
        assert_ptr_equal(mm->in[1], other ? mm->in[1] : w);
        if (other) assert_int_equal(mm->in[1]->op, OP_CAST);
        assert_int_equal(g->n_fwd, n_fwd + (other ? 3 : 2));
        check_graph(g);
    }
    IrGraph *g = ir_graph_new(&((Fixture *)*state)->arena); /* without frozen_half: a cast as ever */
    IrNode *mm = product_graph(g, 1, 0);
    autocast_half(g, DT_BF16, 0);
    assert_int_equal(g->params[0].node->dtype, DT_F32);
    assert_int_equal(mm->in[1]->op, OP_CAST);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_insert_forward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_insert_at_boundary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replace_all_uses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replace_some_uses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replace_result, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_operand, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unplaced_dropped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_node_spec, setup, teardown),
        cmocka_unit_test_setup_teardown(test_autocast_parts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_autocast_frozen_half, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
