/* test_layouts.c - physical layouts as orders of a tensor's axes (compiler/ir/ir.h).
 *
 * Checks what the layout pass and both emitters rely on: every order has one value (the
 * identity is row-major at any rank, [N,C,H,W] in the order N,H,W,C is LAYOUT_NHWC); the layout of
 * a permute read in place composes (permuting by p then q is permuting by p after q, and the
 * inverse permute gives the operand's layout back, over every permutation of rank 4 from every
 * starting layout); the layout of a reshape read in place (a patch embedding's channels-last
 * [N,D,h,w] as [N,D,h*w] and back, axes of 1 anywhere, and the merges the bytes do not allow);
 * two layouts store a shape alike exactly when its axes longer than 1 come in the same order;
 * the printed names; and the verifier refuses a layout that is not an order of the node's axes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ir.h"

static const SrcLoc loc = {"test.net", 1, 1};

/* The 24 permutations of 0..3, in lexicographic order. */
static int all_perms(int perms[24][4]) {
    int n = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++)
                for (int d = 0; d < 4; d++)
                    if (a != b && a != c && a != d && b != c && b != d && c != d) {
                        int p[4] = {a, b, c, d};
                        memcpy(perms[n++], p, sizeof p);
                    }
    return n;
}

static void test_canonical(void **state) {
    (void)state;
    int id[IR_MAX_RANK] = {0, 1, 2, 3, 4, 5}, nhwc[4] = {0, 2, 3, 1};
    for (int rank = 0; rank <= IR_MAX_RANK; rank++) assert_true(ir_layout_eq(ir_layout(rank, id), LAYOUT_ROW_MAJOR));
    assert_true(ir_layout_eq(ir_layout(4, nhwc), LAYOUT_NHWC));
    int other[4] = {0, 2, 1, 3};
    assert_false(ir_layout_eq(ir_layout(4, other), LAYOUT_NHWC));
    assert_false(ir_layout_eq(ir_layout(4, other), LAYOUT_ROW_MAJOR));
    int order[IR_MAX_RANK];
    ir_layout_order(LAYOUT_NHWC, 4, order);
    assert_memory_equal(order, nhwc, sizeof nhwc);
    ir_layout_order(LAYOUT_ROW_MAJOR, 5, order);
    assert_memory_equal(order, id, 5 * sizeof *id);
}

/* The two cases the layout pass makes views of: an [N,H,W,C] value permuted to [N,C,H,W] lies
 * channels-last, and a channels-last one permuted to [N,H,W,C] lies row-major. */
static void test_channels_last_views(void **state) {
    (void)state;
    int to_nchw[4] = {0, 3, 1, 2}, to_nhwc[4] = {0, 2, 3, 1};
    assert_true(ir_layout_eq(ir_layout_permuted(LAYOUT_ROW_MAJOR, 4, to_nchw), LAYOUT_NHWC));
    assert_true(ir_layout_eq(ir_layout_permuted(LAYOUT_NHWC, 4, to_nhwc), LAYOUT_ROW_MAJOR));
    int swap[2] = {1, 0};
    char buf[40];
    assert_string_equal(ir_layout_str(ir_layout_permuted(LAYOUT_ROW_MAJOR, 2, swap), buf, sizeof buf), "order=1,0");
}

static void test_composition(void **state) {
    (void)state;
    int perms[24][4];
    int n = all_perms(perms);
    assert_int_equal(n, 24);
    for (int s = 0; s < n; s++) {
        IrLayout start = ir_layout(4, perms[s]);
        for (int i = 0; i < n; i++) {
            const int *p = perms[i];
            int inverse[4];
            for (int a = 0; a < 4; a++) inverse[p[a]] = a;
            IrLayout after_p = ir_layout_permuted(start, 4, p);
            assert_true(ir_layout_eq(ir_layout_permuted(after_p, 4, inverse), start));
            for (int j = 0; j < n; j++) {
                const int *q = perms[j];
                int pq[4];
                for (int a = 0; a < 4; a++) pq[a] = p[q[a]]; /* permute(permute(x, p), q) */
                assert_true(ir_layout_eq(ir_layout_permuted(after_p, 4, q), ir_layout_permuted(start, 4, pq)));
            }
        }
    }
}

/* The layout ir_layout_reshaped gives from x stored in `order_x` (NULL: row-major), as a
 * string, or "no". */
static const char *reshaped(const int *order_x, IrShape x, IrShape y, char *buf, size_t size) {
    IrLayout ly, lx = order_x ? ir_layout(x.rank, order_x) : LAYOUT_ROW_MAJOR;
    return ir_layout_reshaped(lx, &x, &y, &ly) ? ir_layout_str(ly, buf, size) : "no";
}

static void test_reshaped(void **state) {
    (void)state;
    char buf[40];
    int nhwc[4] = {0, 2, 3, 1}, tokens[3] = {0, 2, 1};
    IrShape nchw = ir_shape(4, (int64_t)2, (int64_t)8, (int64_t)4, (int64_t)4);
    IrShape ncl = ir_shape(3, (int64_t)2, (int64_t)8, (int64_t)16);
    /* row-major stays row-major, whatever the shapes */
    assert_string_equal(reshaped(NULL, nchw, ir_shape(2, (int64_t)16, (int64_t)16), buf, sizeof buf), "row-major");
    assert_string_equal(reshaped(NULL, ncl, ir_shape(5, (int64_t)1, (int64_t)2, (int64_t)1, (int64_t)128,
                                                       (int64_t)1), buf, sizeof buf), "row-major");
    /* a patch embedding: [N,D,h,w] channels-last is [N,D,h*w] in the order N, h*w, D, and back */
    assert_string_equal(reshaped(nhwc, nchw, ncl, buf, sizeof buf), "order=0,2,1");
    assert_string_equal(reshaped(tokens, ncl, nchw, buf, sizeof buf), "nhwc");
    /* flattening channels-last [N,C,H,W] to [N, C*H*W]: C lies innermost, not first */
    assert_string_equal(reshaped(nhwc, nchw, ir_shape(2, (int64_t)2, (int64_t)128), buf, sizeof buf), "no");
    /* but [N, C, 1, 1] (after global pooling) flattens in place, row-major */
    IrShape pooled = ir_shape(4, (int64_t)2, (int64_t)8, (int64_t)1, (int64_t)1);
    assert_string_equal(reshaped(nhwc, pooled, ir_shape(2, (int64_t)2, (int64_t)8), buf, sizeof buf), "row-major");
    /* splitting an axis that lies outermost, with axes of 1 added: [N,D,L] in the order N, L, D
     * as [N, 1, D, h, w]: the new axis of 1 goes before D, the split axes where L lay */
    IrShape five = ir_shape(5, (int64_t)2, (int64_t)1, (int64_t)8, (int64_t)4, (int64_t)4);
    assert_string_equal(reshaped(tokens, ncl, five, buf, sizeof buf), "order=0,1,3,4,2");
    /* merging axes that do not lie side by side in their order: [A,B,C] stored in the order
     * B, A, C as [A*B, C] (B before A) or [A, B*C] (A between B and C); stored A, C, B as
     * [A, B*C] (C before B) */
    int bac[3] = {1, 0, 2}, acb[3] = {0, 2, 1}, cab[3] = {2, 0, 1};
    IrShape abc = ir_shape(3, (int64_t)3, (int64_t)5, (int64_t)7);
    assert_string_equal(reshaped(bac, abc, ir_shape(2, (int64_t)15, (int64_t)7), buf, sizeof buf), "no");
    assert_string_equal(reshaped(bac, abc, ir_shape(2, (int64_t)3, (int64_t)35), buf, sizeof buf), "no");
    assert_string_equal(reshaped(acb, abc, ir_shape(2, (int64_t)3, (int64_t)35), buf, sizeof buf), "no");
    /* stored C, A, B: A and B lie side by side in order, so [A*B, C] lies C outermost */
    assert_string_equal(reshaped(cab, abc, ir_shape(2, (int64_t)15, (int64_t)7), buf, sizeof buf), "order=1,0");
}

static IrNode node_of(IrShape shape, IrLayout layout) {
    IrNode n;
    memset(&n, 0, sizeof n);
    n.op = OP_RELU;
    n.shape = shape;
    n.dtype = DT_F32;
    n.layout = layout;
    return n;
}

static void test_stored_as(void **state) {
    (void)state;
    IrNode full = node_of(ir_shape(4, (int64_t)2, (int64_t)3, (int64_t)4, (int64_t)5), LAYOUT_NHWC);
    IrNode one_channel = node_of(ir_shape(4, (int64_t)2, (int64_t)1, (int64_t)4, (int64_t)5), LAYOUT_NHWC);
    IrNode one_pixel = node_of(ir_shape(4, (int64_t)2, (int64_t)3, (int64_t)1, (int64_t)1), LAYOUT_NHWC);
    assert_false(ir_stored_as(&full, LAYOUT_ROW_MAJOR));
    assert_true(ir_stored_as(&full, LAYOUT_NHWC));
    assert_true(ir_stored_as(&one_channel, LAYOUT_ROW_MAJOR));
    assert_true(ir_stored_as(&one_pixel, LAYOUT_ROW_MAJOR));
    assert_true(ir_layout_matters(&full.shape));
    assert_false(ir_layout_matters(&one_channel.shape) || ir_layout_matters(&one_pixel.shape));
    /* heads [B, H, T, d] in the order B, T, H, d: row-major only with one head */
    int heads[4] = {0, 2, 1, 3};
    IrNode many = node_of(ir_shape(4, (int64_t)2, (int64_t)4, (int64_t)8, (int64_t)16), ir_layout(4, heads));
    IrNode single = node_of(ir_shape(4, (int64_t)2, (int64_t)1, (int64_t)8, (int64_t)16), ir_layout(4, heads));
    assert_false(ir_stored_as(&many, LAYOUT_ROW_MAJOR));
    assert_true(ir_stored_as(&single, LAYOUT_ROW_MAJOR));
    assert_false(ir_stored_as(&many, LAYOUT_NHWC));
}

static void test_names(void **state) {
    (void)state;
    char buf[40];
    int o[IR_MAX_RANK] = {5, 0, 4, 1, 3, 2}, t[3] = {2, 0, 1};
    assert_string_equal(ir_layout_str(LAYOUT_ROW_MAJOR, buf, sizeof buf), "row-major");
    assert_string_equal(ir_layout_str(LAYOUT_NHWC, buf, sizeof buf), "nhwc");
    assert_string_equal(ir_layout_str(ir_layout(IR_MAX_RANK, o), buf, sizeof buf), "order=5,0,4,1,3,2");
    assert_string_equal(ir_layout_str(ir_layout(3, t), buf, sizeof buf), "order=2,0,1");
}

/* The verifier takes a layout only as an order of the node's own axes. */
static void test_verifier(void **state) {
    (void)state;
    Arena arena = {0};
    IrGraph *g = ir_graph_new(&arena);
    g->model_name = "test";
    g->batch = 2;
    IrNode *x = ir_add_input(g, "x", ir_shape(3, (int64_t)2, (int64_t)3, (int64_t)4), DT_F32, loc);
    IrNode *y = ir_add(g, OP_RELU, x->shape, DT_F32, loc, 1, x);
    int order[3] = {0, 2, 1};
    y->layout = ir_layout(3, order);
    assert_true(ir_verify(g, "layout test"));
    y->layout = LAYOUT_NHWC; /* four axes on a rank-3 value */
    assert_false(ir_verify(g, "layout test"));
    y->layout = (IrLayout){1, {0, 1, 2}}; /* the identity, not written as row-major */
    assert_false(ir_verify(g, "layout test"));
    arena_free(&arena);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_canonical),  cmocka_unit_test(test_channels_last_views),
        cmocka_unit_test(test_composition), cmocka_unit_test(test_reshaped),
        cmocka_unit_test(test_stored_as),
        cmocka_unit_test(test_names),      cmocka_unit_test(test_verifier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
