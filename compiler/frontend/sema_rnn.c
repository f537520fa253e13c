/* sema_rnn.c - the recurrent layers lstm and gru, as torch.nn.LSTM and torch.nn.GRU: their
 * parameters under PyTorch's names and layouts (LABEL.weight_ih_l0 [gates * hidden, input],
 * weight_hh_l0 [gates * hidden, hidden], bias_ih_l0, bias_hh_l0, ..._l1 for the next layer),
 * PyTorch's initialisation U(-1/sqrt(hidden), 1/sqrt(hidden)), its gate order (LSTM: input,
 * forget, cell, output; GRU: reset, update, new) and zero initial states.
 *
 * The sequence is unrolled at compile time, as the static shapes allow: per layer one matrix
 * product for the input's share of every step's gates ([T * N, input] by the weight), then per
 * step one product of the previous state and element-wise gates, which fuse. The steps' states
 * are joined into the output by concatenations in a balanced tree (a chain would copy the
 * growing output once per step). Autodiff then gives backpropagation through time.
 */
#include <math.h>
#include <string.h>

#include "sema_args.h"

typedef struct {
    Sema *S;
    SrcLoc at;
    int64_t N, H;
} Rnn;

static IrNode *ew2(const Rnn *r, IrOp op, IrNode *a, IrNode *b) { return sema_binary(r->S, op, a, b, r->at); }
static IrNode *ew1(const Rnn *r, IrOp op, IrNode *x) { return sema_unary(r->S, op, x, r->at); }

/* x [R, K] by w [G, K] transposed, plus b [G] */
static IrNode *affine(const Rnn *r, IrNode *x, IrNode *w, IrNode *b) {
    IrNode *y = sema_node(r->S, OP_MATMUL, ir_shape(2, x->shape.dim[0], w->shape.dim[0]), DT_F32, r->at, 2, x, w, NULL);
    y->attr.trans_b = 1;
    return ew2(r, OP_ADD, y, b);
}

/* gate k of a [N, gates * H] value */
static IrNode *gate(const Rnn *r, IrNode *g, int k) { return sema_slice(r->S, g, 1, k * r->H, r->H, r->at); }

/* steps[lo..hi) joined along axis 0, halves first */
static IrNode *join_steps(const Rnn *r, IrNode **steps, int lo, int hi) {
    if (hi - lo == 1) return steps[lo];
    int mid = lo + (hi - lo) / 2;
    IrNode *a = join_steps(r, steps, lo, mid), *b = join_steps(r, steps, mid, hi); /* in this order */
    return sema_concat(r->S, a, b, 0, r->at);
}

/* One layer over x [T, N, I]: its four parameters, then the steps; the states [T, N, H]. */
static IrNode *layer(const Rnn *r, const char *name, int l, int lstm, IrNode *x) {
    Sema *S = r->S;
    const int64_t T = x->shape.dim[0], I = x->shape.dim[2], G = (lstm ? 4 : 3) * r->H;
    const double bound = 1.0 / sqrt((double)r->H);
    static const char *const kinds[] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    const IrShape shapes[] = {ir_shape(2, G, I), ir_shape(2, G, r->H), ir_shape(1, G), ir_shape(1, G)};
    IrNode *p[4];
    for (int k = 0; k < 4; k++) {
        IrParam *q = sema_new_param(S, arena_printf(S->arena, "%s.%s_l%d", name, kinds[k], l), shapes[k], INIT_UNIFORM,
                                    bound, r->at);
        if (!q) return NULL;
        p[k] = q->node;
    }
    /* the input's share of every step's gates at once */
    IrNode *xw = affine(r, sema_reshape(S, x, ir_shape(2, T * r->N, I), r->at), p[0], p[2]);
    xw = sema_reshape(S, xw, ir_shape(3, T, r->N, G), r->at);
    IrNode **steps = arena_alloc(S->arena, (size_t)T * sizeof *steps);
    IrNode *h = NULL, *c = NULL, *one = lstm ? NULL : ir_const(S->g, 1, DT_F32, r->at);
    for (int64_t t = 0; t < T; t++) {
        IrNode *xt = sema_reshape(S, sema_slice(S, xw, 0, t, 1, r->at), ir_shape(2, r->N, G), r->at);
        /* the state's share: b_hh alone at the first step, whose state is zero */
        IrNode *hw = h ? affine(r, h, p[1], p[3]) : p[3];
        if (lstm) {
            IrNode *gates = ew2(r, OP_ADD, xt, hw);
            IrNode *i = ew1(r, OP_SIGMOID, gate(r, gates, 0)), *g = ew1(r, OP_TANH, gate(r, gates, 2));
            IrNode *o = ew1(r, OP_SIGMOID, gate(r, gates, 3)), *ig = ew2(r, OP_MUL, i, g);
            /* the forget gate acts from the second step: the first's cell state is zero */
            c = c ? ew2(r, OP_ADD, ew2(r, OP_MUL, ew1(r, OP_SIGMOID, gate(r, gates, 1)), c), ig) : ig;
            h = ew2(r, OP_MUL, o, ew1(r, OP_TANH, c));
        } else { /* n = tanh(x_n + r * (W_hn h + b_hn)), h' = (1 - z) n + z h */
            if (!h) hw = sema_node(S, OP_EXPAND, ir_shape(2, r->N, G), DT_F32, r->at, 1, hw, NULL, NULL);
            IrNode *rg = ew1(r, OP_SIGMOID, ew2(r, OP_ADD, gate(r, xt, 0), gate(r, hw, 0)));
            IrNode *z = ew1(r, OP_SIGMOID, ew2(r, OP_ADD, gate(r, xt, 1), gate(r, hw, 1)));
            IrNode *n = ew1(r, OP_TANH, ew2(r, OP_ADD, gate(r, xt, 2), ew2(r, OP_MUL, rg, gate(r, hw, 2))));
            IrNode *keep = ew2(r, OP_SUB, one, z);
            h = h ? ew2(r, OP_ADD, ew2(r, OP_MUL, keep, n), ew2(r, OP_MUL, z, h)) : ew2(r, OP_MUL, keep, n);
        }
        steps[t] = sema_reshape(S, h, ir_shape(3, (int64_t)1, r->N, r->H), r->at);
    }
    return join_steps(r, steps, 0, (int)T);
}

/* lstm(x, hidden, layers=1, batch_first=false) and gru(...): x [T, N, input] ([N, T, input] with
 * batch_first) to every step's last-layer state [T, N, hidden] ([N, T, hidden]); the last
 * step's is out[-1] (out[:, -1]). */
Value sema_b_rnn(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 3, 3);
    int64_t hidden = arg_int(A, 1, 1, 1), layers = arg_int(A, 2, 1, 1);
    int batch_first = arg_bool(A, 3, 0);
    if (!A->ok) return sema_error();
    static const int swap[IR_MAX_RANK] = {1, 0, 2}; /* sema_permute reads IR_MAX_RANK entries */
    if (batch_first) x = sema_permute(S, x, swap, c->loc);
    const int64_t T = x->shape.dim[0];
    if (T > 4096) {
        diag_error(c->loc, "%s over %lld steps: at most 4096 are unrolled", c->name, (long long)T);
        diag_hint("a longer sequence can be cut into windows, as truncated backpropagation through time does");
        return sema_error();
    }
    if (layers > 64 || hidden > 1 << 20) {
        diag_error(c->loc, "%s: %lld layers of %lld, above the 64 layers or the 1048576 hidden units it takes",
                   c->name, (long long)layers, (long long)hidden);
        return sema_error();
    }
    Rnn r = {S, c->loc, x->shape.dim[1], hidden};
    const char *name = sema_layer_name(S, label, c->name);
    int lstm = strcmp(c->name, "lstm") == 0;
    for (int l = 0; l < layers; l++)
        if (!(x = layer(&r, name, l, lstm, x))) return sema_error();
    return sema_tensor(batch_first ? sema_permute(S, x, swap, c->loc) : x);
}
