/* cuda.c - the CUDA backend: a host C program plus one CUDA C file of kernels per model.
 *
 * Requires: a planned graph (mp_plan has run) whose batch-norm sums were not fused into
 * element-wise loops (the backend's fuse_reductions flag is off); every operand in a layout
 * its operator reads.
 *
 * The device memory is one allocation carved at compile time (see Map): the step state
 * (rt_devstate.h), the staged batch, parameters, gradients, optimizer state, the memory plan's
 * arena, and the partial sums of the batch-norm kernels. Every kernel takes the allocation's
 * base address, and a kernel that reads or writes nodes takes their offsets from it as a second
 * argument (RtKAt, constants of its launch), so the launches never change and the whole step
 * can be captured once as a CUDA Graph; the nodes that differ only in where their operands lie
 * (a transformer's layers) write the same kernel, which is written and compiled once.
 *
 * Each IR node becomes:
 *   - element-wise nodes and fused groups: one kernel, a grid-stride loop whose body is the
 *     same C expression the CPU backend writes (cexpr.c);
 *   - SUM_TO: one block per output element and a fixed-order block reduction; SUM and MEAN:
 *     one block;
 *   - matrix products and convolutions: a cuBLASLt or cuDNN call on a plan built at start-up;
 *   - pooling, softmax, norms, attention, losses, accuracy and batch norm: a kernel calling the
 *     device function of netrt_kernels.cuh with the node's geometry as constants (lib_kernel).
 * Around them, generated kernels keep the step's bookkeeping on the device: the learning rate
 * and dropout seed at the start of a step, the loss and accuracy sums and the non-finite check
 * after the backward pass, the optimizer (one kernel over the flat parameter buffer), and the
 * step counter. Kernels equal but for their values' names (twin_key: another layer's node, an
 * evaluation node that computes what its training twin does) are written once.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "cuda_gen.h"
#include "passes.h"

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static int64_t bn_blocks(int64_t rows) { return (rows + BN_ROWS - 1) / BN_ROWS; }

/* Rows (N * H * W) and channels of a batch-norm operand. */
static void bn_dims(const IrNode *x, int64_t *M, int64_t *C, int64_t *HW) {
    *C = x->shape.dim[1];
    *HW = ir_numel(&x->shape) / (x->shape.dim[0] * *C);
    *M = x->shape.dim[0] * *HW;
}

/* Rows and the last axis D of a norm's operand x. */
static void norm_dims(const IrNode *x, int64_t *rows, int64_t *D) {
    *D = x->shape.dim[x->shape.rank - 1];
    *rows = ir_numel(&x->shape) / *D;
}

/* Bytes of a norm parameter gradient's [blocks, 2, D] double partial sums, before its row
 * statistics in the partial-sum region. */
static int64_t norm_blocks(int64_t rows) { return (rows + NORM_ROWS - 1) / NORM_ROWS; }
static int64_t norm_part_bytes(int64_t rows, int64_t D) { return norm_blocks(rows) * 2 * D * 8; }

/* Blocks of an accuracy's counts (rt_k_accuracy_part): one per row of its logits, at most
 * ACC_BLOCKS; a double each in the partial-sum region. */
static int64_t acc_blocks(const IrNode *logits) {
    const IrShape *s = &logits->shape;
    int64_t rows = ir_numel(s) / (s->rank ? s->dim[s->rank - 1] : 1);
    return rows < 1 ? 1 : rows > ACC_BLOCKS ? ACC_BLOCKS : rows;
}

/* A layer-wise optimizer's blocks (cu_layerwise): the pieces of at most PIECE floats its
 * trainable tensors are cut into, each tensor on its own; *tensors the tensors. */
int64_t cu_layerwise_pieces(const IrGraph *g, int *tensors) {
    int64_t pieces = 0;
    *tensors = 0;
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].trainable) ++*tensors, pieces += (ir_numel(&g->params[i].node->shape) + PIECE - 1) / PIECE;
    return pieces;
}

/* A SUM_TO over rows (cg_sum_to_rows: output o adds x[j * outputs + o]) with enough rows and
 * outputs to fill blocks reading a row's outputs side by side: the number of runs of rows it is
 * summed in (emit_sum_to), else 0. */
static int64_t sum_runs(const IrNode *n) {
    if (n->op != OP_SUM_TO) return 0;
    const IrNode *x = n->in[0];
    int64_t out_n = ir_numel(&n->shape), red_n = out_n ? ir_numel(&x->shape) / out_n : 0;
    if (x->dtype != DT_F32 || out_n < BLOCK / 2 || red_n < 2 * SUM_RUN_ROWS || !cg_sum_to_rows(n)) return 0;
    int64_t runs = (red_n + SUM_RUN_ROWS - 1) / SUM_RUN_ROWS;
    return runs < SUM_RUNS ? runs : SUM_RUNS;
}

/* The embedding gradient's radix sort (netrt_index.cuh) over `count` positions: its passes of
 * 8 bits (256 digits) over the keys 0..num (num: an index outside the table), its chunks of
 * BLOCK positions, and its place in the partial-sum region: `counts` counts [digits, chunks],
 * then two position buffers [count] at byte offsets pos[0] and pos[1] (int64 each), `bytes` in
 * all. */
typedef struct {
    int passes;
    int64_t chunks, counts, pos[2], bytes;
} GatherSort;

static GatherSort gather_sort(int64_t count, int64_t num) {
    enum { DIGITS = 256 }; /* netrt_index.cuh: a digit a thread of a BLOCK-thread block */
    _Static_assert((int)DIGITS == (int)BLOCK, "the sort's kernels give each of a block's threads one digit");
    GatherSort s = {0};
    int bits = 0;
    while (bits < 63 && num >> bits) bits++;
    s.passes = (bits + 7) / 8;
    s.chunks = (count + BLOCK - 1) / BLOCK;
    s.counts = DIGITS * s.chunks;
    s.pos[0] = s.counts * 8;
    s.pos[1] = s.pos[0] + count * 8;
    s.bytes = s.pos[1] + count * 8;
    return s;
}
static int64_t gather_sort_bytes(const IrNode *n) {
    return n->op == OP_GATHER_BWD ? gather_sort(ir_numel(&n->in[0]->shape), n->shape.dim[0]).bytes : 0;
}

static Map plan_memory(const IrGraph *g) {
    Map m = {0};
    int64_t at = align_up((int64_t)sizeof(RtDevState));
    m.batch = at;
    int64_t in = align_up((int64_t)sizeof(RtBatchHeader));
    for (int i = 0; i < g->n_inputs; i++) {
        const IrNode *n = g->inputs[i].node;
        m.input[i] = in;
        in = align_up(in + ir_numel(&n->shape) * ir_dtype_size(n->dtype));
    }
    m.batch_bytes = in;
    at += in;
    m.params = at, at = align_up(at + cg_half_params_from(g) * 4);
    if (g->n_half_params) m.half_params = at, at = align_up(at + g->n_half_params * 2);
    m.arena = at, at = align_up(at + (g->arena_bytes > 64 ? g->arena_bytes : 64));
    int64_t part = 8; /* the largest [blocks, 2, C] double partial sums of any batch norm, or a
                       * norm's parameter gradient: [blocks, 2, D] doubles, then [rows, 2] floats,
                       * or an accuracy's counts, or a SUM_TO's runs of rows, or an
                       * embedding gradient's sort */
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        if (n->op == OP_LAYERNORM_BWD_PARAMS || n->op == OP_RMSNORM_BWD_PARAMS || n->attr.norm_params) {
            int64_t rows, D;
            norm_dims(n->in[0], &rows, &D);
            if (norm_part_bytes(rows, D) + rows * 2 * 4 > part) part = norm_part_bytes(rows, D) + rows * 2 * 4;
        }
        if (n->op == OP_ACCURACY && acc_blocks(n->in[0]) * 8 > part) part = acc_blocks(n->in[0]) * 8;
        const int64_t runs_bytes = sum_runs(n) * ir_numel(&n->shape) * 8;
        if (runs_bytes > part) part = runs_bytes;
        if (gather_sort_bytes(n) > part) part = gather_sort_bytes(n);
        if (n->op != OP_BN_STATS && n->op != OP_BN_BWD_SUMS) continue;
        int64_t M, C, HW;
        bn_dims(n->in[0], &M, &C, &HW);
        /* --sync-bn: then two sums of C + 1 doubles (emit_bn_sync) */
        int64_t need = bn_blocks(M) * 2 * C * 8 + (g->sync_bn ? (2 * C + 2) * 8 : 0);
        if (need > part) part = need;
    }
    /* cu_clip's sums (clip_grad_norm, or the loss scale's overflow check), and with a sharded
     * optimizer their total, summed over the ranks */
    int64_t clip_part = (CLIP_BLOCKS + (g->shard_optimizer ? 1 : 0)) * 8;
    if ((g->train.clip_grad_norm > 0 || g->loss_scaling) && part < clip_part) part = clip_part;
    if (rt_optimizer(g->train.optim)->apply_fn) { /* cu_layerwise's sums and factors */
        int tensors;
        int64_t pieces = cu_layerwise_pieces(g, &tensors);
        if (part < pieces * 16 + tensors * 4) part = pieces * 16 + tensors * 4;
    }
    m.part = at, at = align_up(at + part);
    /* the training step's alone last, so that an evaluation's copy of the regions (--eval-async)
     * can leave them out */
    m.eval_end = at;
    m.grads = at, at = align_up(at + g->n_grad_floats * 4);
    if (g->shard_optimizer) /* the slice table; the state, its size the rank's, goes last */
        m.shard = at, at = align_up(at + (3 * (int64_t)g->n_buckets + 1) * 8);
    else
        m.optstate = at, at = align_up(at + cg_state_slots(&g->train) * g->n_grad_floats * 4);
    m.total = at;
    if (g->shard_optimizer) m.optstate = at; /* after the allocation netc sizes (netrt_cuda.h) */
    return m;
}

/* Bytes from the base to node n's first element (views included). */
int64_t cu_dev_offset(const Cu *u, const IrNode *n) {
    const IrNode *r = ir_storage_root(n);
    int64_t elems = 0;
    for (const IrNode *v = n; v != r; v = v->in[0])
        if (v->op == OP_ROW) elems += v->attr.row * ir_numel(&v->shape);
        else if (v->op == OP_PART) elems += v->attr.part;
    int64_t bytes = elems * ir_dtype_size(n->dtype);
    switch (r->storage) {
    case ST_ARENA: return u->map.arena + r->offset + bytes;
    case ST_PARAM:
        if (r->dtype != DT_F32) /* kept in half (--frozen-half) */
            return u->map.half_params + (r->offset - cg_half_params_from(u->g)) * 2 + bytes;
        return u->map.params + r->offset * 4 + bytes;
    case ST_GRAD: return u->map.grads + r->offset * 4 + bytes;
    case ST_INPUT: return u->map.batch + u->map.input[r->index] + bytes;
    case ST_STATE: return u->map.state + (int64_t)offsetof(RtDevState, loss_scale);
    default: ICE("cuda: %%%d = %s has no device storage", n->id, ir_op_name(n->op));
    }
}

/* The host expression for a node's device pointer: (const float *)(base + 4096). */
static void host_ptr(Cu *u, const IrNode *n, int writable) {
    cg_put(&u->step, "(%s%s *)(base + %" PRId64 ")", writable ? "" : "const ", ir_dtype_ctype(n->dtype),
           cu_dev_offset(u, n));
}

/* ---- kernels */

/* Cg's at_slot for the kernel being written: the next entry of its RtKAt holds node n's place
 * (bytes from the base) or `number`; -1 once the RtKAt is full, and the text keeps the constant. */
static int at_slot(Cg *c, const IrNode *n, int64_t number) {
    Cu *u = (Cu *)c; /* c is Cu's first member */
    if (u->n_at == RT_K_AT) return -1;
    u->at[u->n_at] = n ? cu_dev_offset(u, n) : number;
    return u->n_at++;
}

void cu_kernel_open(Cu *u) {
    u->c.out = open_memstream(&u->buf, &u->buf_size);
    if (!u->c.out) ICE("cuda: out of memory");
    memset(u->c.decl, 0, (size_t)u->g->n + 1);
    u->c.depth = 1; /* the body, which cu_kernel_close puts between the kernel's braces */
    u->n_at = 0;
}

static int ident_char(char ch) { return isalnum((unsigned char)ch) || ch == '_'; }

/* What two kernel bodies are compared by: the body without its comment lines, and with the
 * names of the values it reads and computes (v<id>, t<id>, h<id>) numbered in the order they
 * first appear instead of by id. Where those values lie and the dropout seeds are the kernel's
 * RtKAt, not its text (at_slot), so the nodes that compute the same thing on other operands (a
 * transformer's layers, evaluation beside training) give the same key and share one kernel,
 * which NVRTC compiles once; any other difference, a constant, a shape, a type, stays in it. */
static char *twin_key(Cu *u, const char *body) {
    char *key;
    size_t size;
    FILE *f = open_memstream(&key, &size);
    if (!f) ICE("cuda: out of memory");
    int next = 0;
    for (int i = 0; i <= u->g->n; i++) u->renum[i] = -1;
    for (const char *p = body; *p;) {
        const char *text = p + strspn(p, " "), *eol = strchr(p, '\n');
        eol = eol ? eol + 1 : p + strlen(p);
        if (text[0] == '/' && text[1] == '/') { /* a comment line */
            p = eol;
            continue;
        }
        while (p < eol) {
            char *end;
            if (strchr("vthls", *p) && (p == body || !ident_char(p[-1])) &&
                isdigit((unsigned char)p[1])) {
                long id = strtol(p + 1, &end, 10);
                if (!ident_char(*end) && id <= u->g->n) {
                    if (u->renum[id] < 0) u->renum[id] = next++;
                    fprintf(f, "%c#%d", *p, u->renum[id]);
                    p = end;
                    continue;
                }
            }
            fputc(*p++, f);
        }
    }
    fclose(f);
    return key;
}

/* Finish the kernel being written: write it to the .cu file unless a twin exists (twin_key),
 * and launch it from the host step with `grid` blocks of `block` threads, with at[0..n_at) as
 * its RtKAt where it reads one. */
void cu_kernel_close(Cu *u, const char *name, unsigned grid, unsigned block, const char *what) {
    if (u->c.depth != 1) ICE("cuda: kernel %s ends inside a block", name);
    fclose(u->c.out);
    u->c.out = NULL;
    char *key = twin_key(u, u->buf);
    int k = 0;
    while (k < u->n_kernels && (u->kernels[k].n_at != u->n_at || strcmp(u->kernels[k].key, key) != 0)) k++;
    if (k == u->n_kernels) {
        if (u->n_kernels == u->cap) {
            u->cap = u->cap ? 2 * u->cap : 64;
            u->kernels = realloc(u->kernels, (size_t)u->cap * sizeof *u->kernels);
            if (!u->kernels) ICE("cuda: out of memory");
        }
        Kernel *kn = &u->kernels[u->n_kernels++];
        snprintf(kn->name, sizeof kn->name, "%s", name);
        kn->key = key;
        kn->n_at = u->n_at;
        cg_open(&u->cu, "extern \"C\" __global__ void __launch_bounds__(%d) %s(unsigned char *base%s) {", BLOCK, name,
                u->n_at ? ", const RtKAt at" : "");
        cg_line(&u->cu, "NETC_CTX(base);");
        fputs(u->buf, u->cu.out); /* printed at depth 1 */
        cg_close(&u->cu, "}\n");
    } else {
        free(key);
    }
    free(u->buf);
    u->buf = NULL;
    if (!u->n_at) {
        cg_line(&u->step, "rt_cuda_launch(cu, K_%s, %u, %u); // %s", u->kernels[k].name, grid, block, what);
        return;
    }
    cg_begin(&u->step, "rt_cuda_launch_at(cu, K_%s, %u, %u, &(RtKAt){{", u->kernels[k].name, grid, block);
    for (int i = 0; i < u->n_at; i++) cg_put(&u->step, "%s%" PRId64, i ? ", " : "", u->at[i]);
    cg_end(&u->step, "}}); // %s", what);
}

/* A launch's comment for node n, into buf: `what %89 bert.net:55`. */
static const char *node_what(const IrNode *n, const char *what, char *buf, size_t size) {
    memset(buf, 0, size); /* the last byte stays the text's end: f writes no further */
    FILE *f = fmemopen(buf, size - 1, "w");
    if (!f) ICE("cuda: out of memory");
    fprintf(f, "%s %%%d", what, n->id);
    if (n->loc.file) {
        fputc(' ', f);
        cg_comment_text(f, cg_base_name(n->loc.file));
        fprintf(f, ":%d", n->loc.line);
    }
    fclose(f);
    return buf;
}

/* A kernel's name, for the profile (Nsight, ncu) as much as for the code: k (training step) or
 * e (evaluation), the node's id and `suffix`, which keep names unique, then the operators it
 * computes in order (a group's members, repeats dropped, as far as the name has room) and the
 * .net line they come from: k8_add_relu_l11. */
static void kernel_name(const Cu *u, const IrNode *head, const char *suffix, char *buf, size_t size) {
    const Cg *c = &u->c;
    const IrNode *n; /* FOR_MEMBERS's variable */
    const char *last = NULL;
    size_t len = (size_t)snprintf(buf, size, "%s%d%s", c->eval ? "e" : "k", head->id, suffix);
    char line[16] = "";
    if (head->loc.line > 0) snprintf(line, sizeof line, "_l%d", head->loc.line);
    size_t room = size - strlen(line) - 1;
#define APPEND_OP(node)                                                                  \
    do {                                                                                 \
        const char *op = ir_op_name((node)->op);                                         \
        if ((!last || strcmp(op, last) != 0) && len + 1 + strlen(op) <= room)           \
            len += (size_t)snprintf(buf + len, size - len, "_%s", op), last = op;        \
    } while (0)
    if (head->group) {
        FOR_MEMBERS(n, head) APPEND_OP(n);
    } else {
        APPEND_OP(head);
    }
#undef APPEND_OP
    snprintf(buf + len, size - len, "%s", line);
}

unsigned cu_grid_for(int64_t n) {
    int64_t b = (n + BLOCK - 1) / BLOCK;
    return (unsigned)(b < 1 ? 1 : b > MAX_GRID ? MAX_GRID : b);
}

static unsigned rows_grid(int64_t rows) { return (unsigned)(rows < 1 ? 1 : rows > MAX_GRID ? MAX_GRID : rows); }

/* Declare, in the kernel being written, every operand of n that lives in memory. */
static void declare_operands(Cu *u, const IrNode *n) {
    for (int k = 0; k < n->n_in; k++) {
        const IrNode *x = n->in[k];
        if (u->c.group && x->group == u->c.group) continue;         /* a local of the group's loop */
        if (x->storage == ST_INLINE && ir_op_kind(n->op) == OPK_EW) continue; /* written as a literal */
        cg_declare_read(&u->c, x); /* x, or what a folded x views */
    }
}

/* The loop over a kernel's `total` elements. Index arithmetic on a 64-bit index costs a 64-bit
 * division for every `/` and `%` of the index expressions (per-channel operands read
 * v[i % C]); where the loop and every tensor the kernel touches have fewer elements than
 * NETC_FOR32's 32-bit index can count past (2^31 - 1, less one grid's stride so `i += stride`
 * cannot overflow), the index is 32-bit and those divisions are 32-bit ones (a multiply by
 * the constant's reciprocal). `largest` is the largest tensor the kernel reads or writes. */
static int index32(int64_t total, int64_t largest) {
    const int64_t limit = INT32_MAX - (int64_t)MAX_GRID * BLOCK;
    return total <= limit && largest <= limit;
}

static const char *loop_macro(int64_t total, int64_t largest) {
    return index32(total, largest) ? "NETC_FOR32" : "NETC_FOR";
}

/* The largest tensor n computes or reads (through folded operands, what they view). */
static int64_t largest_operand(const IrNode *n) {
    int64_t m = ir_numel(&n->shape);
    for (int k = 0; k < n->n_in; k++)
        if (cg_read_numel(n->in[k]) > m) m = cg_read_numel(n->in[k]);
    return m;
}

enum { VEC_LOAD = 1, VEC_STORE = 2 };

/* A tensor one access can read or write four elements of: float32 at an address that is a
 * multiple of 16 (a NetcF4), float16 or bfloat16 at a multiple of 8 (a NetcH4). The arena's base
 * is cudaMalloc's, 256-aligned. */
static int vec_aligned(const Cu *u, const IrNode *x) {
    if (x->storage == ST_STATE || (x->dtype != DT_F32 && !ir_dtype_is_half(x->dtype))) return 0;
    return cu_dev_offset(u, x) % (4 * ir_dtype_size(x->dtype)) == 0;
}

static const char *vec_type(const IrNode *x) { return x->dtype == DT_F32 ? "NetcF4" : "NetcH4"; }

/* Node n of the four-a-thread loop (a member of fused group `group`, or the loop's one node):
 * its vec_aligned operands that it reads in aligned runs of four (cg_quad_axes: element for
 * element, or per channel of a channels-last value) become VEC_LOADs, n a VEC_STORE if
 * it is stored; 0 when it is stored and cannot be written four at a time. */
static int vec_member(Cu *u, const IrNode *n, int group) {
    int stored = !(group && n->internal);
    /* batch norm reads its per-channel operands along the channel axis (cexpr.c's chan_elem),
     * not by broadcasting: only its operands of its own shape go four at a time */
    int by_channel = n->op == OP_BN_APPLY || n->op == OP_BN_BWD_DATA;
    if (stored && !vec_aligned(u, n)) return 0;
    for (int a = 0; a < n->n_in; a++) {
        const IrNode *x = n->in[a];
        if (x->storage == ST_INLINE || (group && x->group == group)) continue;
        if (x->storage == ST_FOLDED) continue; /* read one element at a time, through its view */
        if (by_channel && !ir_shape_eq(&x->shape, &n->shape)) continue;
        CgAxis quad[IR_MAX_RANK * 2];
        if (!u->vec[x->id] && vec_aligned(u, x) && cg_quad_axes(x, n, quad)) {
            u->vec[x->id] = VEC_LOAD;
            u->vec_ids[u->n_vec++] = x->id;
        }
    }
    if (stored) {
        u->vec[n->id] = VEC_STORE;
        u->vec_ids[u->n_vec++] = n->id;
    }
    return 1;
}

/* Whether the element-wise loop of `head` (one node, or fused group `group` from its head) takes
 * four adjacent elements a thread, and which tensors it then reads and writes by one vector
 * access (vec[]): every output it stores must be a vec_aligned tensor, the count a multiple of 4
 * and the index 32-bit; an operand is read so when it is vec_aligned and its reader reads it in
 * aligned runs of four (cg_quad_axes); other broadcast operands stay one element at a time. The
 * members of a group have one shape and layout (fuse.c), so they read an operand alike.
 * Where the 12 RtKAt slots are full the pointers are constants with the same offsets. Alignment
 * and count are each node's own, in the kernel's text, so twins that differ in them do not share. */
static int plan_vec(Cu *u, const IrNode *head, int group, int64_t total, int64_t largest) {
    Cg *c = &u->c; /* FOR_MEMBERS's */
    const IrNode *n;
    memset(u->vec, 0, (size_t)u->g->n + 1);
    u->n_vec = 0;
    if (total % 4 || !index32(total, largest)) return 0;
    if (!group) return vec_member(u, head, 0);
    FOR_MEMBERS(n, head)
        if (!vec_member(u, n, group)) {
            memset(u->vec, 0, (size_t)u->g->n + 1);
            u->n_vec = 0;
            return 0;
        }
    return 1;
}

/* An element-wise kernel's loop over `total` elements of `head`'s shape and layout (every member
 * of its group has them), i its index; four a thread when plan_vec said so: each thread loads its
 * VEC_LOAD operands' four elements (at the index cg_quad_axes gives for head, as for any member
 * that reads them), computes the four in a loop
 * over j (which NVRTC unrolls: j is a constant in each copy, so l<id>.e[j] is a register), and
 * stores each output's four after it (close_loop). */
static void open_loop(Cu *u, const IrNode *head, int vec, int64_t total, int64_t largest) {
    Cg *c = &u->c;
    if (!vec) {
        cg_open(c, "%s(i, %" PRId64 ") {", loop_macro(total, largest), total);
        return;
    }
    cg_open(c, "NETC_FOR32(q, %" PRId64 ") {", total / 4);
    for (int k = 0; k < u->n_vec; k++) {
        const IrNode *x = u->g->nodes[u->vec_ids[k]];
        CgAxis quad[IR_MAX_RANK * 2];
        if (u->vec[x->id] != VEC_LOAD) continue;
        cg_begin(c, "const %s l%d = ((const %s *)v%d)[", vec_type(x), x->id, vec_type(x), x->id);
        cg_index_expr(c->out, "q", quad, cg_quad_axes(x, head, quad), 0);
        cg_end(c, "];");
    }
    for (int k = 0; k < u->n_vec; k++) {
        const IrNode *x = u->g->nodes[u->vec_ids[k]];
        if (u->vec[x->id] == VEC_STORE) cg_line(c, "%s s%d;", vec_type(x), x->id);
    }
    cg_open(c, "for (int32_t j = 0; j < 4; j++) {");
    cg_line(c, "[[maybe_unused]] const int32_t i = q * 4 + j; // the element, for what is read one at a time");
    c->vec = u->vec;
}

static void close_loop(Cu *u, int vec) {
    Cg *c = &u->c;
    cg_close(c, "}");
    if (!vec) return;
    for (int k = 0; k < u->n_vec; k++) {
        const IrNode *x = u->g->nodes[u->vec_ids[k]];
        if (u->vec[x->id] == VEC_STORE) cg_line(c, "((%s *)v%d)[q] = s%d;", vec_type(x), x->id, x->id);
    }
    cg_close(c, "}");
    c->vec = NULL;
}

static void emit_group(Cu *u, const IrNode *head) {
    Cg *c = &u->c;
    const IrNode *n;
    int64_t total = ir_numel(&head->shape);
    char name[KERNEL_NAME], group[64], what[WHAT];
    cu_kernel_open(u);
    cg_group_header(c, head);
    c->group = head->group; /* operands computed inside the group are locals, not pointers */
    int64_t largest = 0;
    FOR_MEMBERS(n, head) {
        declare_operands(u, n);
        if (largest_operand(n) > largest) largest = largest_operand(n);
    }
    c->group = 0;
    int vec = plan_vec(u, head, head->group, total, largest);
    open_loop(u, head, vec, total, largest);
    cg_group_body(c, head);
    close_loop(u, vec);
    kernel_name(u, head, "", name, sizeof name);
    snprintf(group, sizeof group, "fused group %d, %" PRId64 " elements, from", head->group, total);
    cu_kernel_close(u, name, cu_grid_for(vec ? total / 4 : total), BLOCK, node_what(head, group, what, sizeof what));
}

static void emit_ew(Cu *u, const IrNode *n) {
    Cg *c = &u->c;
    int64_t total = ir_numel(&n->shape);
    char name[KERNEL_NAME], what[WHAT];
    cu_kernel_open(u);
    cg_comment(c, n);
    declare_operands(u, n);
    cg_declare(c, n);
    int vec = plan_vec(u, n, 0, total, largest_operand(n));
    open_loop(u, n, vec, total, largest_operand(n));
    cg_ew_store(c, n, 0);
    close_loop(u, vec);
    kernel_name(u, n, "", name, sizeof name);
    cu_kernel_close(u, name, cu_grid_for(vec ? total / 4 : total), BLOCK, node_what(n, ir_op_name(n->op), what, sizeof what));
}

/* A kernel uses `bytes` of the partial-sum region, which device_map sized: an internal error if
 * it did not size it for it (it would write over the gradients after it). */
void cu_part_room(const Cu *u, int64_t bytes, const char *what) {
    if (bytes > u->map.eval_end - u->map.part)
        ICE("cuda: %s needs %" PRId64 " bytes of the partial-sum region, which has %" PRId64, what, bytes,
            u->map.eval_end - u->map.part);
}

/* A SUM_TO over rows with sum_runs(n) = R runs (a bias's gradient: out_n outputs over red_n rows
 * of a [red_n, out_n] gradient): two kernels. In the first, a block takes 256 adjacent outputs
 * and one run of adjacent rows, and each thread adds its output's rows of the run in order, in
 * double, reading the row's outputs side by side with its neighbours, into the partial-sum
 * region ([R, out_n] doubles); the second adds each output's R runs in order. One block per
 * output instead, with its threads strided down the rows, would read 32 rows a warp. */
static void emit_sum_to_runs(Cu *u, const IrNode *n, int64_t runs) {
    Cg *c = &u->c;
    const IrNode *x = n->in[0];
    int64_t out_n = ir_numel(&n->shape), red_n = ir_numel(&x->shape) / out_n;
    int64_t run = (red_n + runs - 1) / runs, chunks = (out_n + BLOCK - 1) / BLOCK;
    char name[KERNEL_NAME], what[WHAT];
    cu_part_room(u, runs * out_n * 8, "a sum over rows");
    cu_kernel_open(u);
    cg_comment(c, n);
    cg_declare(c, x);
    cg_line(c, "double *part = (double *)(base + NETC_OFF_PART);");
    cg_open(c, "for (int64_t b = blockIdx.x; b < %" PRId64 "; b += gridDim.x) {", runs * chunks);
    cg_line(c, "const int64_t o = b %% %" PRId64 " * %d + threadIdx.x, j0 = b / %" PRId64 " * %" PRId64 ";", chunks,
            BLOCK, chunks, run);
    cg_line(c, "if (o >= %" PRId64 ") continue;", out_n);
    cg_line(c, "const int64_t j1 = j0 + %" PRId64 " < %" PRId64 " ? j0 + %" PRId64 " : %" PRId64 ";", run, red_n, run,
            red_n);
    cg_line(c, "double acc = 0;");
    cg_line(c, "for (int64_t j = j0; j < j1; j++) acc += v%d[j * %" PRId64 " + o];", x->id, out_n);
    cg_line(c, "part[b / %" PRId64 " * %" PRId64 " + o] = acc;", chunks, out_n);
    cg_close(c, "}");
    kernel_name(u, n, "_part", name, sizeof name);
    cu_kernel_close(u, name, rows_grid(runs * chunks), BLOCK, node_what(n, "sum_to", what, sizeof what));
    cu_kernel_open(u);
    cg_comment(c, n);
    cg_declare(c, n);
    cg_line(c, "const double *part = (const double *)(base + NETC_OFF_PART);");
    cg_open(c, "RT_K_FOR(o, %" PRId64 ") {", out_n);
    cg_line(c, "double acc = 0;");
    cg_line(c, "for (int64_t r = 0; r < %" PRId64 "; r++) acc += part[r * %" PRId64 " + o];", runs, out_n);
    cg_line(c, "v%d[o] = (float)acc;", n->id);
    cg_close(c, "}");
    kernel_name(u, n, "", name, sizeof name);
    cu_kernel_close(u, name, cu_grid_for(out_n), BLOCK, node_what(n, "sum_to", what, sizeof what));
}

/* SUM_TO: over rows with enough of them, emit_sum_to_runs; else one block per output element,
 * the reduced elements strided over its threads and summed in double by a fixed tree
 * (rt_block_sum). Either way every run gives the same bits. */
static void emit_sum_to(Cu *u, const IrNode *n) {
    Cg *c = &u->c;
    const IrNode *x = n->in[0];
    int64_t out_n = ir_numel(&n->shape), red_n = ir_numel(&x->shape) / out_n;
    char name[KERNEL_NAME], what[WHAT];
    const int64_t runs = sum_runs(n);
    if (runs) {
        emit_sum_to_runs(u, n, runs);
        return;
    }
    cu_kernel_open(u);
    cg_comment(c, n);
    cg_declare(c, x);
    cg_declare(c, n);
    cg_open(c, "for (int64_t o = blockIdx.x; o < %" PRId64 "; o += gridDim.x) {", out_n);
    cg_begin(c, "%s", ""); /* cg_sum_to_base prints the whole line's text */
    cg_sum_to_base(c->out, n);
    cg_end(c, "%s", "");
    cg_line(c, "double acc = 0;");
    cg_open(c, "for (int64_t j = threadIdx.x; j < %" PRId64 "; j += blockDim.x)", red_n);
    cg_begin(c, "acc += ");
    cg_sum_to_elem(c->out, n);
    cg_end(c, ";");
    c->depth--; /* the loop's one statement, without braces */
    cg_line(c, "acc = rt_block_sum(acc);");
    cg_line(c, "if (threadIdx.x == 0) v%d[o] = (float)acc;", n->id);
    cg_close(c, "}");
    kernel_name(u, n, "", name, sizeof name);
    cu_kernel_close(u, name, rows_grid(out_n), BLOCK, node_what(n, "sum_to", what, sizeof what));
}

static void emit_reduce(Cu *u, const IrNode *n) {
    Cg *c = &u->c;
    const IrNode *x = n->in[0];
    int64_t total = ir_numel(&x->shape);
    char name[KERNEL_NAME], what[WHAT];
    if (n->op == OP_SUM_TO) {
        emit_sum_to(u, n);
        return;
    }
    if (n->dtype != DT_F32 || x->dtype != DT_F32) ICE("cuda: %s of %s", ir_op_name(n->op), ir_dtype_name(x->dtype));
    int masked = n->op == OP_MEAN && n->attr.batch_masked && x->shape.rank > 0;
    cu_kernel_open(u);
    cg_comment(c, n);
    cg_declare(c, x);
    cg_declare(c, n);
    if (masked)
        cg_line(c, "const int64_t count = ctx->n_valid * %" PRId64 "; // valid rows only", total / x->shape.dim[0]);
    else cg_line(c, "const int64_t count = %" PRId64 ";", total);
    cg_line(c, "rt_k_mean(count, v%d, %d, v%d);", x->id, n->op == OP_MEAN, n->id);
    kernel_name(u, n, "", name, sizeof name);
    cu_kernel_close(u, name, 1, BLOCK, node_what(n, ir_op_name(n->op), what, sizeof what));
}

/* ---- library operators */

/* The token v<id> in a library call: after a space or a parenthesis, with no digit after it. */
static int operand_at(const char *call, const char *p, int len) {
    return (p == call || p[-1] == ' ' || p[-1] == '(') && (p[len] < '0' || p[len] > '9');
}

static int mentions(const char *call, int id) {
    char v[16];
    int len = snprintf(v, sizeof v, "v%d", id);
    for (const char *p = call; (p = strstr(p, v)); p += len)
        if (operand_at(call, p, len)) return 1;
    return 0;
}

/* A library kernel: `call`, one device function of netrt_kernels.cuh on the pointers v<id> of n
 * and its operands, in a kernel of its own. Their places are the kernel's RtKAt (at_slot), so the
 * nodes that differ only in where their operands lie share one kernel (twin_key).
 * extra[0..n_extra) are per-node integers the call reads as at.o[0..n_extra) (attention's dropout
 * seed id, batch norm's running statistics), before the operands. */
static void lib_kernel_at(Cu *u, const IrNode *n, const char *call, const int64_t *extra, int n_extra,
                          const char *suffix, unsigned grid, unsigned block) {
    Cg *c = &u->c;
    char name[KERNEL_NAME], what[WHAT];
    if (n_extra > RT_K_AT) ICE("cuda: %s passes %d integers to its kernel", ir_op_name(n->op), n_extra);
    cu_kernel_open(u);
    for (int i = 0; i < n_extra; i++) u->at[u->n_at++] = extra[i];
    cg_comment(c, n);
    for (int k = 0; k <= n->n_in; k++) { /* the pointers this call uses */
        const IrNode *v = k < n->n_in ? n->in[k] : n;
        if (mentions(call, v->id)) cg_declare(c, v);
    }
    cg_line(c, "%s", call);
    kernel_name(u, n, suffix, name, sizeof name);
    cu_kernel_close(u, name, grid, block, node_what(n, ir_op_name(n->op), what, sizeof what));
}

static void lib_kernel(Cu *u, const IrNode *n, const char *call, const char *suffix, unsigned grid,
                       unsigned block) {
    lib_kernel_at(u, n, call, NULL, 0, suffix, grid, block);
}

/* A product whose epilogue group is exactly `mm + bias`, `relu(mm + bias)` or, in float32,
 * `gelu_tanh(mm + bias)` (cuBLASLt's GELU is the tanh form), with only the group's last value
 * read elsewhere and the product read by nothing else: cuBLASLt computes the group in its
 * epilogue (BIAS, RELU_BIAS, GELU_BIAS) and writes the last value directly. GELU's input may be
 * stored too (its gradient reads it): then cuBLASLt writes it as the aux matrix
 * (GELU_AUX_BIAS), whose leading dimension must be a multiple of 8. Returns the last value and
 * sets *bias, *aux (the stored input, or NULL), *head (the group's first member) and *epi, or
 * returns NULL and leaves *bias and *aux as they were. */
static const IrNode *lt_epilogue(const Cu *u, const IrNode *mm, const IrNode **bias, const IrNode **aux,
                                 const IrNode **head, const char **epi) {
    const IrGraph *g = u->g;
    if (!mm->epilogue || mm->shape.rank != 2 || u->readers[mm->id] != 1) return NULL;
    const char *kind = epilogue_kind(g, mm);
    int gelu = strcmp(kind, "GELU_TANH_BIAS") == 0;
    if (strcmp(kind, "BIAS") != 0 && strcmp(kind, "RELU_BIAS") != 0 && !(gelu && mm->dtype == DT_F32)) return NULL;
    const IrNode *add = NULL, *last = NULL;
    for (int i = mm->id + 1; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        if (n->op == OP_CONST) continue;
        if (n->group != mm->epilogue) break;
        if (n->op == OP_ADD) add = n;
        if (last && !last->internal && !(gelu && last == add)) return NULL; /* a value before the last one is
                                                                             * stored: keep the kernel */
        if (!last) *head = n;
        last = n;
    }
    if (!add || (add->in[0] != mm && add->in[1] != mm) || last->internal) return NULL;
    if (gelu && (last->in[0] != add || (!add->internal && mm->shape.dim[1] % 8))) return NULL;
    const IrNode *b = add->in[0] == mm ? add->in[1] : add->in[0];
    if (ir_numel(&b->shape) != mm->shape.dim[1] || ir_storage_root(b)->storage != ST_PARAM) return NULL;
    *bias = b; /* set only here: the caller passes *bias to the product whether this returns or not */
    *aux = gelu && !add->internal ? add : NULL;
    *epi = strcmp(kind, "BIAS") == 0 ? "RT_EPI_BIAS" : !gelu ? "RT_EPI_RELU_BIAS"
           : *aux ? "RT_EPI_GELU_AUX_BIAS" : "RT_EPI_GELU_BIAS";
    return last;
}

/* `rt_cuda_gemm(cu, PLAN, a, b, out, bias, aux);` on the step, bias and aux NULL when not given. */
static void gemm_call(Cu *u, const char *plan, const IrNode *a, const IrNode *b, const IrNode *out, const IrNode *bias,
                      const IrNode *aux) {
    cg_begin(&u->step, "rt_cuda_gemm(cu, %s, ", plan);
    host_ptr(u, a, 0);
    cg_put(&u->step, ", ");
    host_ptr(u, b, 0);
    cg_put(&u->step, ", ");
    host_ptr(u, out, 1);
    cg_put(&u->step, ", ");
    if (bias) host_ptr(u, bias, 0);
    else cg_put(&u->step, "NULL");
    cg_put(&u->step, ", ");
    if (aux) host_ptr(u, aux, 1);
    else cg_put(&u->step, "NULL");
    cg_end(&u->step, ");");
}

/* A product, with its epilogue group when cuBLASLt computes it (lt_epilogue). cuBLASLt may have
 * no algorithm for an epilogue on some GPU, version and shape: GELU's on some, and PyTorch
 * found BIAS's refused by the heuristic (CUBLAS_STATUS_INVALID_VALUE) where a matrix has one row
 * or column (aten/src/ATen/native/cuda/Blas.cpp uses the epilogue only above that). So every
 * product with an epilogue is planned with rt_cuda_gemm_plan_try, and where that finds nothing,
 * a plain product (gemmN_plain) into the product's own buffer and the group's generated kernel
 * run instead, chosen once at start-up. */
static void emit_matmul(Cu *u, const IrNode *n) {
    const IrNode *a = n->in[0], *b = n->in[1], *bias = NULL, *aux = NULL, *head = NULL, *out = n;
    const char *epi = "RT_EPI_NONE";
    const IrNode *last = lt_epilogue(u, n, &bias, &aux, &head, &epi);
    const int fallback = last != NULL;
    if (last) { /* the group is the product's epilogue: no kernel of its own */
        u->c.done[n->epilogue] = 1;
        out = last;
    }
    int r = n->shape.rank, ta = n->attr.trans_a, tb = n->attr.trans_b;
    int64_t M = n->shape.dim[r - 2], N = n->shape.dim[r - 1], K = a->shape.dim[r - 1 - ta];
    int64_t lda = a->shape.dim[r - 1], ldb = b->shape.dim[r - 1], batch = r == 3 ? n->shape.dim[0] : 1;
    char args[256];
    snprintf(args, sizeof args, "cu, %d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
             ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64, ta, tb, M, N, K, lda, ldb, N, batch, M * K, K * N, M * N);
    if (!u->planned[n->id]) {
        u->planned[n->id] = fallback ? 2 : 1;
        cg_line(&u->plan, "gemm%d = rt_cuda_gemm_plan%s(%s, %s, %s);", n->id, fallback ? "_try" : "", args, epi,
                cg_dtype_enums[n->dtype]);
        if (fallback)
            cg_line(&u->plan, "if (!gemm%d) gemm%d_plain = rt_cuda_gemm_plan(%s, RT_EPI_NONE, %s);", n->id, n->id, args,
                    cg_dtype_enums[n->dtype]);
    }
    if (last)
        cg_line(&u->step, "// with its epilogue, fused group %d (%s): cuBLASLt writes %%%d", n->epilogue,
                epilogue_kind(u->g, n), last->id);
    char plan[32];
    snprintf(plan, sizeof plan, "gemm%d", n->id);
    if (fallback) cg_open(&u->step, "if (%s) {", plan);
    gemm_call(u, plan, a, b, out, bias, aux);
    if (!fallback) return;
    cg_close(&u->step, "} else { /* no algorithm with the epilogue: the product, then the group's kernel */");
    u->step.depth++;
    snprintf(plan, sizeof plan, "gemm%d_plain", n->id);
    gemm_call(u, plan, a, b, n, NULL, NULL);
    emit_group(u, head);
    cg_close(&u->step, "}");
}

/* cuDNN takes the filter in the activations' format: KRSC beside NHWC (the layout pass's
 * krsc_filters), KCRS beside NCHW; the generated kernels have permuted it already. */
static void emit_conv(Cu *u, const IrNode *n) {
    int which = cg_conv_which(n);
    int nhwc = ir_operand_nhwc(n, 0);
    const IrNode *filter = which == CG_CONV_BWD_FILTER ? n : n->in[1];
    if (!ir_stored_as(filter, nhwc ? LAYOUT_NHWC : LAYOUT_ROW_MAJOR))
        ICE("cuda: %%%d %s reads %s activations with a filter in the other order", n->id, ir_op_name(n->op),
            nhwc ? "NHWC" : "NCHW");
    if (!u->planned[n->id]) {
        u->planned[n->id] = 1;
        cg_conv_geometry(&u->plan, n, "geom");
        cg_line(&u->plan, "conv%d = rt_cuda_conv_plan(cu, &geom%d, %d, %d, %s);", n->id, n->id, which, nhwc,
                cg_dtype_enums[n->dtype]);
    }
    cg_begin(&u->step, "rt_cuda_conv(cu, conv%d, ", n->id);
    host_ptr(u, n->in[0], 0);
    cg_put(&u->step, ", ");
    host_ptr(u, n->in[1], 0);
    cg_put(&u->step, ", ");
    host_ptr(u, n, 1);
    cg_end(&u->step, ");");
}

static void emit_pool(Cu *u, const IrNode *n) {
    int max, bwd;
    cg_pool_kind(n, &max, &bwd);
    const IrShape *x = bwd ? &n->shape : &n->in[0]->shape;
    const IrShape *y = bwd ? &n->in[n->n_in - 1]->shape : &n->shape;
    const IrAttrs *a = &n->attr;
    char call[512];
    int at = snprintf(call, sizeof call,
                      "rt_k_%spool_%s(RtKPool{%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                      ", %" PRId64 ", %d, %d, %d, %d, %d, %d}, %d",
                      max ? "max" : "avg", bwd ? "bwd" : "fwd", x->dim[0], x->dim[1], x->dim[2], x->dim[3], y->dim[2],
                      y->dim[3], a->kernel[0], a->kernel[1], a->stride[0], a->stride[1], a->pad[0], a->pad[1],
                      ir_layout_eq(n->layout, LAYOUT_NHWC));
    for (int k = 0; k < n->n_in; k++) at += snprintf(call + at, sizeof call - (size_t)at, ", v%d", n->in[k]->id);
    snprintf(call + at, sizeof call - (size_t)at, ", v%d);", n->id);
    lib_kernel(u, n, call, "", cu_grid_for(ir_numel(&n->shape)), BLOCK); /* outputs, or inputs gathered */
}

/* Layer norm and RMS norm over the last axis D of [rows, D]: a block per row, or for the
 * parameter gradients three kernels through the partial-sum region (netrt_rows.cuh): the row
 * statistics (written by dx's kernel when the node computes dx too, attr.norm_params), the
 * blocks' partial sums, their totals. */
static void emit_norm(Cu *u, const IrNode *n) {
    int64_t rows, D;
    norm_dims(n->in[0], &rows, &D);
    int rms = n->op == OP_RMSNORM || n->op == OP_RMSNORM_BWD || n->op == OP_RMSNORM_BWD_PARAMS;
    int x = n->in[0]->id, w = n->in[1]->id; /* the parameter gradients: w is dy */
    char call[512], eps[48], stats[96], params[48];
    const char *part = "(double *)(base + NETC_OFF_PART)";
    snprintf(eps, sizeof eps, "%.17g", n->attr.norm_eps);
    snprintf(stats, sizeof stats, "(float *)(base + NETC_OFF_PART + %" PRId64 "LL)", norm_part_bytes(rows, D));
    switch (n->op) {
    case OP_LAYERNORM:
        snprintf(call, sizeof call, "rt_k_norm_fwd(%" PRId64 ", %" PRId64 ", 0, v%d, v%d, v%d, %s, v%d);", rows, D, x, w,
                 n->in[2]->id, eps, n->id);
        lib_kernel(u, n, call, "", rows_grid(rows), BLOCK);
        return;
    case OP_RMSNORM: /* no bias */
        snprintf(call, sizeof call, "rt_k_norm_fwd(%" PRId64 ", %" PRId64 ", 1, v%d, v%d, NULL, %s, v%d);", rows, D, x,
                 w, eps, n->id);
        lib_kernel(u, n, call, "", rows_grid(rows), BLOCK);
        return;
    case OP_LAYERNORM_BWD:
    case OP_RMSNORM_BWD:
        snprintf(call, sizeof call, "rt_k_norm_bwd(%" PRId64 ", %" PRId64 ", %d, v%d, v%d, v%d, %s, v%d, %s);", rows, D,
                 rms, x, w, n->in[2]->id, eps, n->id, n->attr.norm_params ? stats : "NULL");
        lib_kernel(u, n, call, "", rows_grid(rows), BLOCK);
        if (!n->attr.norm_params) return;
        w = n->in[2]->id; /* dy, for the parameter gradients after dx */
        snprintf(params, sizeof params, "v%d + %" PRId64, n->id, rows * D);
        break;
    default: /* the parameter gradients alone: dy is operand 1 */
        snprintf(call, sizeof call, "rt_k_norm_stats(%" PRId64 ", %" PRId64 ", %d, v%d, %s, %s);", rows, D, rms, x, eps,
                 stats);
        lib_kernel(u, n, call, "_stats", rows_grid(rows), BLOCK);
        snprintf(params, sizeof params, "v%d", n->id);
        break;
    }
    snprintf(call, sizeof call, "rt_k_norm_params_part(%" PRId64 ", %" PRId64 ", v%d, v%d, %s, %s);", rows, D, x, w,
             stats, part);
    lib_kernel(u, n, call, "_part", cu_grid_for(norm_blocks(rows) * D), BLOCK);
    snprintf(call, sizeof call, "rt_k_norm_params_final(%" PRId64 ", %" PRId64 ", %d, %s, %s);", D, norm_blocks(rows),
             rms, part, params);
    lib_kernel(u, n, call, "_sum", cu_grid_for(D), BLOCK);
}

/* Softmax and log-softmax along any axis: a block per row of [outer * inner rows, len]. */
static void emit_axis_rows(Cu *u, const IrNode *n) {
    int64_t outer, inner, len = n->in[0]->shape.dim[n->attr.axis];
    cg_axis_split(&n->in[0]->shape, n->attr.axis, &outer, &inner);
    int a = n->in[0]->id;
    char call[512];
    const char *fn = n->op == OP_SOFTMAX ? "softmax_axis_fwd" : n->op == OP_SOFTMAX_BWD ? "softmax_axis_bwd"
                     : n->op == OP_LOG_SOFTMAX ? "log_softmax_fwd" : "log_softmax_bwd";
    if (n->n_in > 1)
        snprintf(call, sizeof call, "rt_k_%s(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, v%d);", fn, outer, len,
                 inner, a, n->in[1]->id, n->id);
    else
        snprintf(call, sizeof call, "rt_k_%s(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d);", fn, outer, len, inner,
                 a, n->id);
    lib_kernel(u, n, call, "", rows_grid(outer * inner), BLOCK);
}

/* Softmax, cross-entropy and accuracy see their first operand as [rows, last axis]. */
static void emit_rows(Cu *u, const IrNode *n) {
    const IrShape *s = &n->in[0]->shape;
    int64_t cols = s->rank ? s->dim[s->rank - 1] : 1, rows = ir_numel(s) / cols;
    int a = n->in[0]->id, b = n->n_in > 1 ? n->in[1]->id : -1;
    char call[512], lit[48], valid[64] = "ctx->n_valid";
    switch (n->op) {
    case OP_LAYERNORM: case OP_LAYERNORM_BWD: case OP_LAYERNORM_BWD_PARAMS:
    case OP_RMSNORM: case OP_RMSNORM_BWD: case OP_RMSNORM_BWD_PARAMS:
        emit_norm(u, n);
        return;
    case OP_LOG_SOFTMAX: case OP_LOG_SOFTMAX_BWD: emit_axis_rows(u, n); return;
    case OP_SOFTMAX: case OP_SOFTMAX_BWD:
        if (n->attr.axis != s->rank - 1) {
            emit_axis_rows(u, n);
            return;
        }
        break;
    default: break;
    }
    FILE *f = fmemopen(lit, sizeof lit, "w");
    cg_lit(f, n->attr.smoothing);
    fclose(f);
    /* the rows that count: of [..., C] logits with more axes, the n_valid samples' rows when
     * axis 0 is the batch, else all */
    if (s->rank > 2 && s->dim[0] == u->g->batch) snprintf(valid, sizeof valid, "ctx->n_valid * %" PRId64, rows / s->dim[0]);
    else if (s->rank > 2) snprintf(valid, sizeof valid, "%" PRId64, rows);
    switch (n->op) {
    case OP_SOFTMAX:
        snprintf(call, sizeof call, "rt_k_softmax_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d);", rows, cols, a, n->id);
        break;
    case OP_SOFTMAX_BWD:
        snprintf(call, sizeof call, "rt_k_softmax_bwd(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d);", rows, cols, a, b, n->id);
        break;
    case OP_XENT:
        if (n->attr.has_ignore)
            snprintf(call, sizeof call, "rt_k_xent_ignore_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d, %s, %" PRId64
                     ", %s, v%d);", rows, cols, a, b, lit, n->attr.ignore_index, valid, n->id);
        else
            snprintf(call, sizeof call, "rt_k_xent_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d, %s, %s, v%d);", rows, cols,
                     a, b, lit, valid, n->id);
        break;
    case OP_XENT_BWD: /* the rows' log-sum-exp from the loss (operand 3) */
        if (n->attr.has_ignore)
            snprintf(call, sizeof call, "rt_k_xent_ignore_bwd(%" PRId64 ", %" PRId64 ", v%d, v%d, %s, %" PRId64
                     ", %s, v%d, v%d, v%d);", rows, cols, a, b, lit, n->attr.ignore_index, valid, n->in[3]->id,
                     n->in[2]->id, n->id);
        else
            snprintf(call, sizeof call, "rt_k_xent_bwd(%" PRId64 ", %" PRId64 ", v%d, v%d, %s, %s, v%d, v%d, v%d);",
                     rows, cols, a, b, lit, valid, n->in[3]->id, n->in[2]->id, n->id);
        break;
    case OP_ACCURACY: { /* a block per row counts, one block adds the counts; of a sequence, its
                         * thread 0 then divides by the rows per sample */
        char ignore[32] = "RT_K_NO_IGNORE", divide[128] = "";
        const int64_t blocks = acc_blocks(n->in[0]);
        if (n->attr.has_ignore) /* the correct positions, which the trainer divides by those it counts */
            snprintf(ignore, sizeof ignore, "%" PRId64, n->attr.ignore_index);
        else if (s->rank > 2) {
            FILE *fp = fmemopen(lit, sizeof lit, "w");
            cg_lit(fp, (double)(rows / s->dim[0]));
            fclose(fp);
            snprintf(divide, sizeof divide, " if (blockIdx.x == 0 && threadIdx.x == 0) v%d[0] = v%d[0] / %s;", n->id,
                     n->id, lit);
        }
        if (n->attr.top_k > 1)
            snprintf(call, sizeof call, "rt_k_accuracy_top_part(%" PRId64 ", %" PRId64 ", v%d, v%d, %s, %d, %s, "
                     "(double *)(base + NETC_OFF_PART));", rows, cols, a, b, ignore, n->attr.top_k, valid);
        else
            snprintf(call, sizeof call, "rt_k_accuracy_part(%" PRId64 ", %" PRId64 ", v%d, v%d, %s, %s, "
                     "(double *)(base + NETC_OFF_PART));", rows, cols, a, b, ignore, valid);
        cu_part_room(u, blocks * 8, "an accuracy's counts");
        lib_kernel(u, n, call, "_part", (unsigned)blocks, BLOCK);
        snprintf(call, sizeof call, "rt_k_accuracy_total(%" PRId64 ", (const double *)(base + NETC_OFF_PART), v%d);%s",
                 blocks, n->id, divide);
        lib_kernel(u, n, call, "_sum", 1, BLOCK);
        return;
    }
    default: ICE("cuda: %s is not a per-row kernel", ir_op_name(n->op));
    }
    lib_kernel(u, n, call, "", rows_grid(rows), BLOCK);
}

/* Embedding rows, and their gradient: zero the table, sort the positions by row stably (three
 * kernels a pass), then the thread that starts a row's run of positions, per column, adds them
 * in increasing position (netrt_index.cuh). */
static void emit_index(Cu *u, const IrNode *n) {
    char call[512];
    if (n->op == OP_GATHER) {
        const IrNode *t = n->in[0], *idx = n->in[1];
        int64_t count = ir_numel(&idx->shape);
        snprintf(call, sizeof call, "rt_k_gather(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, v%d);", count,
                 t->shape.dim[0], t->shape.dim[1], t->id, idx->id, n->id);
        lib_kernel(u, n, call, "", cu_grid_for(count * t->shape.dim[1]), BLOCK);
        return;
    }
    if (n->op != OP_GATHER_BWD) ICE("cuda: %s is not an index kernel", ir_op_name(n->op));
    const IrNode *idx = n->in[0], *dy = n->in[1];
    const int64_t count = ir_numel(&idx->shape), num = n->shape.dim[0], dim = n->shape.dim[1];
    const GatherSort sort = gather_sort(count, num);
    cu_part_room(u, sort.bytes, "an embedding gradient's sort");
    snprintf(call, sizeof call, "rt_k_gather_bwd_zero(%" PRId64 ", %" PRId64 ", v%d);", num, dim, n->id);
    lib_kernel(u, n, call, "_zero", cu_grid_for(num * dim), BLOCK);
    const char *counts = "(int64_t *)(base + NETC_OFF_PART)";
    char src[80] = "(const int64_t *)0", dst[80] = "", suffix[24]; /* _count and an int */
    for (int p = 0; p < sort.passes; p++) {
        snprintf(dst, sizeof dst, "(int64_t *)(base + NETC_OFF_PART + %" PRId64 "LL)", sort.pos[p % 2]);
        snprintf(call, sizeof call, "rt_k_gather_sort_count(%" PRId64 ", %" PRId64 ", %d, v%d, %s, %s);", count, num,
                 8 * p, idx->id, src, counts);
        snprintf(suffix, sizeof suffix, "_count%d", p);
        lib_kernel(u, n, call, suffix, rows_grid(sort.chunks), BLOCK);
        snprintf(call, sizeof call, "rt_k_gather_sort_scan(%" PRId64 ", %s);", sort.counts, counts);
        snprintf(suffix, sizeof suffix, "_scan%d", p);
        lib_kernel(u, n, call, suffix, 1, BLOCK);
        snprintf(call, sizeof call, "rt_k_gather_sort_move(%" PRId64 ", %" PRId64 ", %d, v%d, %s, %s, %s);", count, num,
                 8 * p, idx->id, src, counts, dst);
        snprintf(suffix, sizeof suffix, "_move%d", p);
        lib_kernel(u, n, call, suffix, rows_grid(sort.chunks), BLOCK);
        snprintf(src, sizeof src, "%s", dst);
    }
    snprintf(call, sizeof call, "rt_k_gather_bwd_runs(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, %s, v%d, v%d);", count,
             num, dim, idx->id, src, dy->id, n->id);
    lib_kernel(u, n, call, "_runs", cu_grid_for(count * dim), BLOCK);
}

/* --sync-bn: batch-norm node n (statistics, or the backward sums) sums over the ranks: a batch
 * norm in training whose statistics are the batch's, not frozen ones (codegen/cpu.c's rule). */
static int sync_bn(const Cu *u, const IrNode *n) {
    const IrNode *stats = n->op == OP_BN_BWD_SUMS ? n->in[1] : n;
    return u->g->sync_bn && !u->c.eval && !stats->attr.bn_frozen;
}

/* --sync-bn: the sums of the CPU trainer's synchronised batch norm, in the partial-sum region
 * after the blocks' partials: s1 = [C + 1] doubles (2C + 1 for the backward sums), s2 = [C + 1].
 * Each goes through rt_cuda_sum_doubles (NCCL, on the collectives' stream, forked and joined)
 * between the kernels. Statistics: the blocks' sums of x, their sum over the ranks, the
 * squared deviations from that global mean, their sum over the ranks, the statistics; backward:
 * the blocks' sums, their mean over the ranks. */
static void emit_bn_sync(Cu *u, const IrNode *n, int64_t M, int64_t C, int64_t HW, int nhwc) {
    const IrNode *x = n->in[0];
    int64_t nb = bn_blocks(M), at1 = nb * 2 * C * 8, at2 = at1 + (C + 1) * 8;
    char call[512], s1[96], s2[96];
    const char *part = "(double *)(base + NETC_OFF_PART)";
    snprintf(s1, sizeof s1, "(double *)(base + NETC_OFF_PART + %" PRId64 "LL)", at1);
    snprintf(s2, sizeof s2, "(double *)(base + NETC_OFF_PART + %" PRId64 "LL)", at2);
    if (n->op == OP_BN_BWD_SUMS) {
        snprintf(call, sizeof call, "rt_k_bn_bwd_part(%" PRId64 ", %" PRId64 ", %" PRId64 ", %d, v%d, v%d, v%d, %s);", M,
                 C, HW, nhwc, x->id, n->in[1]->id, n->in[2]->id, part);
        lib_kernel(u, n, call, "_part", cu_grid_for(nb * C), BLOCK);
        snprintf(call, sizeof call, "rt_k_bn_sync_sums(%" PRId64 ", %" PRId64 ", %" PRId64 ", %s, 1.0, %s);", 2 * C,
                 2 * C, nb, part, s1);
        lib_kernel(u, n, call, "_sum", rows_grid(2 * C + 1), BLOCK);
        cg_line(&u->step, "rt_cuda_sum_doubles(cu, %" PRId64 "LL, %" PRId64 "); // over every rank's batch",
                u->map.part + at1, 2 * C + 1);
        snprintf(call, sizeof call, "rt_k_bn_sync_mean(%" PRId64 ", %s, v%d);", 2 * C, s1, n->id);
        lib_kernel(u, n, call, "_mean", cu_grid_for(2 * C), BLOCK);
        return;
    }
    const IrParam *rm = &u->g->params[n->attr.stat_param];
    snprintf(call, sizeof call, "rt_k_bn_stats_part(%" PRId64 ", %" PRId64 ", %" PRId64 ", %d, v%d, %s);", M, C, HW, nhwc,
             x->id, part);
    lib_kernel(u, n, call, "_part", cu_grid_for(nb * C), BLOCK);
    snprintf(call, sizeof call, "rt_k_bn_sync_sums(%" PRId64 ", %" PRId64 ", %" PRId64 ", %s, %" PRId64 ".0, %s);", C,
             2 * C, nb, part, M, s1);
    lib_kernel(u, n, call, "_sum", rows_grid(C + 1), BLOCK);
    cg_line(&u->step, "rt_cuda_sum_doubles(cu, %" PRId64 "LL, %" PRId64 "); // the sums of x over every rank's batch",
            u->map.part + at1, C + 1);
    snprintf(call, sizeof call, "rt_k_bn_sync_sqdev(%" PRId64 ", %" PRId64 ", %" PRId64 ", %d, v%d, %s, %s);", M, C, HW,
             nhwc, x->id, s1, part);
    lib_kernel(u, n, call, "_sqdev", cu_grid_for(nb * C), BLOCK);
    snprintf(call, sizeof call, "rt_k_bn_sync_sums(%" PRId64 ", %" PRId64 ", %" PRId64 ", %s, %" PRId64 ".0, %s);", C, C,
             nb, part, M, s2);
    lib_kernel(u, n, call, "_sum2", rows_grid(C + 1), BLOCK);
    cg_line(&u->step, "rt_cuda_sum_doubles(cu, %" PRId64 "LL, %" PRId64 "); // their squared deviations",
            u->map.part + at2, C + 1);
    const int64_t running = u->map.params + rm->offset * 4; /* the running statistics: at.o[0] */
    snprintf(call, sizeof call, "rt_k_bn_sync_final(%" PRId64 ", %s, %s, v%d, %.17g, %.17g, (float *)(base + at.o[0]));",
             C, s1, s2, n->id, n->attr.eps, n->attr.momentum);
    lib_kernel_at(u, n, call, &running, 1, "_stats", cu_grid_for(C), BLOCK);
}

/* Batch-norm statistics and backward sums: per fixed block of rows into the shared partial-sum
 * region, then one thread block per channel over those partials (two kernels). */
static void emit_bn(Cu *u, const IrNode *n) {
    const IrNode *x = n->in[0];
    int64_t M, C, HW;
    bn_dims(x, &M, &C, &HW);
    int64_t nb = bn_blocks(M);
    int nhwc = ir_layout_eq(x->layout, LAYOUT_NHWC);
    char call[512];
    const char *part = "(double *)(base + NETC_OFF_PART)";
    if (sync_bn(u, n)) {
        emit_bn_sync(u, n, M, C, HW, nhwc);
        return;
    }
    if (n->op == OP_BN_BWD_SUMS) {
        snprintf(call, sizeof call, "rt_k_bn_bwd_part(%" PRId64 ", %" PRId64 ", %" PRId64 ", %d, v%d, v%d, v%d, %s);", M,
                 C, HW, nhwc, x->id, n->in[1]->id, n->in[2]->id, part);
        lib_kernel(u, n, call, "_part", cu_grid_for(nb * C), BLOCK);
        snprintf(call, sizeof call, "rt_k_bn_bwd_final(%" PRId64 ", %" PRId64 ", %s, v%d);", C, nb, part, n->id);
        lib_kernel(u, n, call, "_sum", rows_grid(2 * C), BLOCK);
        return;
    }
    if (n->op != OP_BN_STATS) ICE("cuda: %s is not a batch-norm reduction", ir_op_name(n->op));
    const IrParam *rm = &u->g->params[n->attr.stat_param];
    char eps[48], mom[48];
    snprintf(eps, sizeof eps, "%.17g", n->attr.eps);
    snprintf(mom, sizeof mom, "%.17g", n->attr.momentum);
    int batch_stats = !u->c.eval && !n->attr.bn_frozen; /* else the running statistics, unchanged */
    if (batch_stats) {
        snprintf(call, sizeof call, "rt_k_bn_stats_part(%" PRId64 ", %" PRId64 ", %" PRId64 ", %d, v%d, %s);", M, C, HW,
                 nhwc, x->id, part);
        lib_kernel(u, n, call, "_part", cu_grid_for(nb * C), BLOCK);
    }
    const int64_t running = u->map.params + rm->offset * 4; /* the running statistics: at.o[0] */
    snprintf(call, sizeof call,
             "rt_k_bn_stats_final(%" PRId64 ", %" PRId64 ", %" PRId64 ", %s, v%d, %s, %s, (float *)(base + at.o[0]), %d);",
             M, C, nb, part, n->id, eps, mom, batch_stats);
    lib_kernel_at(u, n, call, &running, 1, "_stats", rows_grid(C), BLOCK);
}

/* Copies and reductions along an axis (cg_axis_split's [outer, n, inner]): one grid-stride loop
 * over the outputs (netrt_views.cuh). */
static void emit_axes(Cu *u, const IrNode *n) {
    const IrNode *x = n->in[0];
    int axis = n->attr.axis, at = 0;
    int64_t outer, inner, total = ir_numel(&n->shape), threads = total;
    char call[768];
    switch (n->op) {
    case OP_PERMUTE: {
        int64_t stride[IR_MAX_RANK], s = 1;
        int r = x->shape.rank;
        for (int i = r - 1; i >= 0; i--) stride[i] = s, s *= x->shape.dim[i];
        at = snprintf(call, sizeof call, "rt_k_permute(RtKPermute{{");
        for (int i = 0; i < r; i++) at += snprintf(call + at, sizeof call - (size_t)at, "%s%" PRId64, i ? ", " : "", n->shape.dim[i]);
        at += snprintf(call + at, sizeof call - (size_t)at, "}, {");
        for (int i = 0; i < r; i++)
            at += snprintf(call + at, sizeof call - (size_t)at, "%s%" PRId64, i ? ", " : "", stride[n->attr.perm[i]]);
        snprintf(call + at, sizeof call - (size_t)at, "}, %d}, %" PRId64 ", v%d, v%d);", r, total, x->id, n->id);
        break;
    }
    case OP_SLICE:
        cg_axis_split(&x->shape, axis, &outer, &inner);
        snprintf(call, sizeof call, "rt_k_slice(%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d);",
                 outer, x->shape.dim[axis], n->shape.dim[axis], inner, n->attr.start, x->id, n->id);
        break;
    case OP_SLICE_BWD:
        cg_axis_split(&n->shape, axis, &outer, &inner);
        snprintf(call, sizeof call,
                 "rt_k_slice_bwd(%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d);", outer,
                 n->shape.dim[axis], x->shape.dim[axis], inner, n->attr.start, x->id, n->id);
        break;
    case OP_CONCAT:
        cg_axis_split(&n->shape, axis, &outer, &inner);
        snprintf(call, sizeof call, "rt_k_concat(%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, v%d);",
                 outer, x->shape.dim[axis], n->in[1]->shape.dim[axis], inner, x->id, n->in[1]->id, n->id);
        break;
    case OP_MAX:
    case OP_MAX_BWD:
        cg_axis_split(&x->shape, axis, &outer, &inner);
        threads = outer * inner; /* one thread per column along the axis */
        if (n->op == OP_MAX)
            snprintf(call, sizeof call, "rt_k_max_axis(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d);", outer,
                     x->shape.dim[axis], inner, x->id, n->id);
        else
            snprintf(call, sizeof call, "rt_k_max_axis_bwd(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, v%d);",
                     outer, x->shape.dim[axis], inner, x->id, n->in[1]->id, n->id);
        break;
    default: ICE("cuda: %s is not a copy along axes", ir_op_name(n->op));
    }
    lib_kernel(u, n, call, "", cu_grid_for(threads), BLOCK);
}

/* Attention (netrt_attention.cuh): the forward one kernel, a block per (slice, tile of 256 query
 * rows); the gradient two, the rows' (dq, and the log-sum-exp and delta into the packed
 * result's tail) and then the keys' (dk, dv), a block per (slice, tile of 256 keys). With heads
 * read from the tokens (fold_attention_heads) the operands are views of their bases, as on the
 * CPU (emit_attention in cpu.c), and a base's gradient with columns no head covers is zeroed
 * by a kernel of its own first. */
static void emit_attention(Cu *u, const IrNode *n) {
    CgAttn a;
    cg_attention_dims(n, &a);
    char geom[512], lit[48], mask[32] = "(const void *)0", call[1024];
    FILE *f = fmemopen(lit, sizeof lit, "w");
    cg_lit(f, n->attr.attn_scale);
    fclose(f);
    int at = snprintf(geom, sizeof geom, "RtKAttn{%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                      ", %s, %d, %d, %d, {", a.BH, a.T, a.S, a.D, a.E, lit, n->attr.causal, a.mask, a.n_lead);
    for (int i = 0; i < 4; i++) at += snprintf(geom + at, sizeof geom - (size_t)at, "%s%" PRId64, i ? ", " : "",
                                               i < a.n_lead ? a.lead[i] : 1);
    at += snprintf(geom + at, sizeof geom - (size_t)at, "}, {");
    for (int i = 0; i < 4; i++) at += snprintf(geom + at, sizeof geom - (size_t)at, "%s%" PRId64, i ? ", " : "",
                                               i < a.n_lead ? a.mask_lead[i] : 0);
    at += snprintf(geom + at, sizeof geom - (size_t)at, "}, %" PRId64 ", %" PRId64, a.mask_t, a.mask_s);
    const double dropout = cg_attn_dropout(&u->c, n);
    const int64_t seed_id = n->attr.seed_id; /* the dropout mask's, at.o[0]: the one per-node integer */
    const int n_seed = dropout > 0;
    if (a.group > 1 || dropout > 0 || a.tokens) /* grouped-query attention, or a field after it */
        at += snprintf(geom + at, sizeof geom - (size_t)at, ", %" PRId64, a.group);
    if (dropout > 0 || a.tokens) { /* attention dropout (the mask at the step's seed), or views after it */
        FILE *fp = fmemopen(lit, sizeof lit, "w");
        cg_dbl(fp, dropout);
        fclose(fp);
        at += snprintf(geom + at, sizeof geom - (size_t)at, ", %s, %s, %s", lit, dropout > 0 ? "(int)at.o[0]" : "0",
                       dropout > 0 ? "ctx->seed" : "0");
    }
    for (int i = 0; i < 4 && a.tokens; i++) /* the views of q, k, v and out: {batch, row} */
        at += snprintf(geom + at, sizeof geom - (size_t)at, ", {%" PRId64 ", %" PRId64 "}",
                       (i == 1 || i == 2 ? a.S : a.T) * a.row[i], a.row[i]);
    snprintf(geom + at, sizeof geom - (size_t)at, "}");
    if (a.mask_node) snprintf(mask, sizeof mask, "v%d", a.mask_node->id);
    char in[3][48]; /* q, k, v: where their first columns are */
    for (int i = 0; i < 3; i++) cg_attention_operand(n, &a, i, in[i], sizeof in[i]);
    const int64_t q_tiles = a.BH * ((a.T + BLOCK - 1) / BLOCK), k_tiles = a.BH / a.group * ((a.S + BLOCK - 1) / BLOCK);
    if (a.n_lead > 4) ICE("cuda: attention with %d leading axes", a.n_lead);
    if (n->op == OP_ATTENTION || n->op == OP_ATTENTION_MASKED) {
        snprintf(call, sizeof call, "rt_k_attention_fwd<%" PRId64 ", %" PRId64 ">(%s, %s, %s, %s, %s, v%d);", a.D, a.E,
                 geom, in[0], in[1], in[2], mask, n->id);
        lib_kernel_at(u, n, call, &seed_id, n_seed, "", rows_grid(q_tiles), BLOCK);
        return;
    }
    for (int i = 0; i < 3; i++) { /* a base's columns that no operand has are 0 in its gradient */
        if (!cg_attention_zeroed(n, &a, i)) continue;
        const int64_t len = ir_numel(&n->in[i]->shape);
        snprintf(call, sizeof call, "rt_k_attention_zero(v%d + %" PRId64 ", %" PRId64 ");", n->id,
                 ir_attention_grad_at(n, i), len);
        char suffix[16];
        snprintf(suffix, sizeof suffix, "_zero%d", i);
        lib_kernel(u, n, call, suffix, cu_grid_for(len), BLOCK);
    }
    char grad[3][48];
    for (int i = 0; i < 3; i++) cg_attention_grad(n, &a, i, grad[i], sizeof grad[i]);
    const int64_t stats = ir_attention_bwd_numel(n) - 2 * a.BH * a.T; /* lse and delta: the packed result's tail */
    snprintf(call, sizeof call, "rt_k_attention_bwd_rows<%" PRId64 ", %" PRId64 ">(%s, %s, %s, %s, %s, v%d, v%d, %s, "
             "v%d + %" PRId64 ");", a.D, a.E, geom, in[0], in[1], in[2], mask, n->in[3]->id, n->in[4]->id, grad[0],
             n->id, stats);
    lib_kernel_at(u, n, call, &seed_id, n_seed, "_rows", rows_grid(q_tiles), BLOCK);
    snprintf(call, sizeof call, "rt_k_attention_bwd_keys<%" PRId64 ", %" PRId64 ">(%s, %s, %s, %s, %s, v%d, v%d + %"
             PRId64 ", %s, %s);", a.D, a.E, geom, in[0], in[1], in[2], mask, n->in[4]->id, n->id, stats, grad[1],
             grad[2]);
    lib_kernel_at(u, n, call, &seed_id, n_seed, "_keys", rows_grid(k_tiles), BLOCK);
}

static void emit_lib(Cu *u, const IrNode *n) {
    IrLibClass cls = ir_op_lib(n->op);
    if (!((cls == LIB_MATMUL || cls == LIB_CONV) && ir_dtype_is_half(n->dtype))) /* half products: autocast.c */
        cg_check_lib_operands(n, "cuda");
    switch (cls) {
    case LIB_MATMUL: emit_matmul(u, n); break;
    case LIB_CONV: emit_conv(u, n); break;
    case LIB_POOL: emit_pool(u, n); break;
    case LIB_ROWS: emit_rows(u, n); break;
    case LIB_BN: emit_bn(u, n); break;
    case LIB_AXES: emit_axes(u, n); break;
    case LIB_ATTN: emit_attention(u, n); break;
    case LIB_INDEX: emit_index(u, n); break;
    case LIB_NONE: ICE("cuda: no kernel for %s", ir_op_name(n->op));
    }
}

static void emit_node(Cu *u, const IrNode *n) {
    IrOpKind kind = ir_op_kind(n->op);
    if (n->storage == ST_INLINE || n->storage == ST_FOLDED || kind == OPK_SOURCE || kind == OPK_VIEW) return; /* no work */
    if (n->fused_into) ICE("cuda: batch-norm sums fused into a loop");
    if (n->group) {
        if (!u->c.done[n->group]) emit_group(u, n);
        return;
    }
    switch (kind) {
    case OPK_EW: emit_ew(u, n); break;
    case OPK_REDUCE: emit_reduce(u, n); break;
    default: emit_lib(u, n); break;
    }
}

/* ---- the two step functions */

/* A printer into a growing buffer whose text begins at `depth`: 1 for a host function's body,
 * which emit_host prints inside the function's braces. */
static Cg open_buffer(char **buf, size_t *size, int depth) {
    FILE *f = open_memstream(buf, size);
    if (!f) ICE("cuda: out of memory");
    return (Cg){.out = f, .depth = depth};
}

/* One pass's kernels and launches: the training step up to its update, or (eval) the forward
 * pass in evaluation mode. */
static void walk(Cu *u, int eval) {
    const IrGraph *g = u->g;
    u->c.eval = eval;
    memset(u->c.done, 0, (size_t)g->n_groups + 1);
    int end = eval ? g->n_fwd : g->n;
    if (!eval) cu_step_begin(u);
    for (int i = 0; i < end; i++) {
        if (i == g->n_fwd) cg_line(&u->step, "// ---- backward");
        emit_node(u, g->nodes[i]);
        if (!eval) cu_grads_ready(u, i);
    }
    if (!eval) {
        cu_grad_copies(u);
        cu_grads_ready(u, g->n);
        cu_grads_sum(u);
    }
    cu_step_end(u, eval);
    u->c.eval = 0;
}

/* ---- the .cu file */

/* Where each region of the device allocation lives, and the context every kernel builds from it. */
static void emit_cu_context(Cu *u, Cg *c) {
    const IrGraph *g = u->g;
    cg_line(c, "#define NETC_OFF_STATE %" PRId64 "LL", u->map.state);
    cg_line(c, "#define NETC_OFF_BATCH %" PRId64 "LL", u->map.batch);
    cg_line(c, "#define NETC_OFF_PARAMS %" PRId64 "LL", u->map.params);
    if (g->n_half_params) cg_line(c, "#define NETC_OFF_HALF_PARAMS %" PRId64 "LL", u->map.half_params);
    cg_line(c, "#define NETC_OFF_GRADS %" PRId64 "LL", u->map.grads);
    cg_line(c, "#define NETC_OFF_OPTSTATE %" PRId64 "LL", u->map.optstate);
    cg_line(c, "#define NETC_OFF_ARENA %" PRId64 "LL", u->map.arena);
    cg_line(c, "#define NETC_OFF_PART %" PRId64 "LL", u->map.part);
    if (g->shard_optimizer) cg_line(c, "#define NETC_OFF_SHARD %" PRId64 "LL // this rank's slices", u->map.shard);
    cg_blank(c);
    cg_line(c, "// The names the shared C expressions use: ctx->arena, ctx->params, ctx->inputs[k], ...");
    cg_open(c, "struct NetCtx {");
    cg_line(c, "unsigned char *arena;");
    cg_line(c, "float *params, *grads, *optstate;");
    if (g->n_half_params) cg_line(c, "unsigned char *half_params; // frozen parameters in half (netc --frozen-half)");
    cg_line(c, "const void *inputs[%d];", g->n_inputs > 0 ? g->n_inputs : 1);
    cg_line(c, "RtDevState *state;");
    cg_line(c, "uint64_t seed;   // this step's dropout seed");
    cg_line(c, "int64_t n_valid; // rows of the batch that are real samples");
    cg_close(c, "};\n");
    cg_open(c, "static __device__ __forceinline__ NetCtx netc_ctx(unsigned char *base) {");
    cg_line(c, "NetCtx c;");
    cg_line(c, "c.arena = base + NETC_OFF_ARENA;");
    cg_line(c, "c.params = (float *)(base + NETC_OFF_PARAMS);");
    if (g->n_half_params) cg_line(c, "c.half_params = base + NETC_OFF_HALF_PARAMS;");
    cg_line(c, "c.grads = (float *)(base + NETC_OFF_GRADS);");
    cg_line(c, "c.optstate = (float *)(base + NETC_OFF_OPTSTATE);");
    for (int i = 0; i < g->n_inputs; i++)
        cg_line(c, "c.inputs[%d] = base + NETC_OFF_BATCH + %" PRId64 ";", i, u->map.input[i]);
    if (!g->n_inputs) cg_line(c, "c.inputs[0] = 0;");
    cg_line(c, "c.state = (RtDevState *)(base + NETC_OFF_STATE);");
    cg_line(c, "c.seed = c.state->step_seed;");
    cg_line(c, "c.n_valid = ((const RtBatchHeader *)(base + NETC_OFF_BATCH))->n_valid;");
    cg_line(c, "return c;");
    cg_close(c, "}\n");
    cg_line(c, "#define NETC_CTX(base) const NetCtx ctx_ = netc_ctx(base); const NetCtx *const ctx = &ctx_; (void)ctx");
    cg_line(c, "#define NETC_FOR(i, n) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); "
               "i += (int64_t)gridDim.x * blockDim.x)");
    cg_line(c, "// four adjacent floats, or halves (float16, bfloat16), which one 16-byte (8-byte) access reads or");
    cg_line(c, "// writes: an element-wise loop's l<id> and s<id>");
    cg_line(c, "struct alignas(16) NetcF4 { float e[4]; };");
    cg_line(c, "struct alignas(8) NetcH4 { uint16_t e[4]; };");
    cg_line(c, "// the same with a 32-bit index, for kernels whose tensors all have fewer than 2^31 - 2^28 elements");
    cg_line(c, "#define NETC_FOR32(i, n) for (int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x); i < (n); "
               "i += (int32_t)(gridDim.x * blockDim.x))\n");
}

static void emit_cu_prologue(Cu *u, FILE *o) {
    const IrGraph *g = u->g;
    Cg c = {.g = g, .out = o, .fn_qual = "__device__ __forceinline__ "}; /* not static: unused ones stay silent */
    cg_begin(&c, "// ");
    cg_comment_text(o, g->model_name);
    cg_put(&c, ".cu - the GPU kernels of model '");
    cg_comment_text(o, g->model_name);
    cg_end(&c, "', generated by netc.");
    cg_line(&c, "// Do not edit: change the .net file and run netc again. netc compiles this file");
    cg_line(&c, "// with NVRTC and embeds the result in the trainer.");
    cg_line(&c, "//");
    cg_line(&c, "// Every kernel takes the base of the trainer's one device allocation; NETC_CTX finds");
    cg_line(&c, "// the regions in it (offsets from the memory plan), so the launches never change. A");
    cg_line(&c, "// kernel that reads or writes tensors takes their offsets from the base as `at` too, the");
    cg_line(&c, "// launch's RtKAt: the nodes that compute alike on other tensors (a model's layers) launch");
    cg_line(&c, "// one kernel, written for the first of them.\n");
    cg_line(&c, "#include \"netrt_kernels.cuh\"");
    cg_line(&c, "#include \"rt_devstate.h\"\n");
    emit_cu_context(u, &c);
    cg_emit_helpers(&c);
    cg_line(&c, "// ---- kernels, in the order the step launches them\n");
}

/* ---- the host program */

/* The prose header (what the file is, the device allocation's regions) and the includes. */
static void emit_host_header(Cu *u, Cg *c) {
    const IrGraph *g = u->g;
    cg_begin(c, "// ");
    cg_comment_text(c->out, g->model_name);
    cg_put(c, ".c - the GPU trainer for model '");
    cg_comment_text(c->out, g->model_name);
    cg_put(c, "', generated by netc from ");
    cg_comment_text(c->out, g->source_path);
    cg_end(c, ".");
    cg_line(c, "// Do not edit: change the .net file and run netc again.");
    cg_line(c, "//");
    cg_line(c, "// The training step runs on the GPU. train() and eval() enqueue one step's kernels and");
    cg_line(c, "// library calls on the stream; libnetrt_cuda captures each once as a CUDA Graph and");
    cg_line(c, "// replays it every step (or launches them one by one with --no-graph). The kernels are");
    cg_line(c, "// in the .cu file beside this one, compiled by netc with NVRTC; their images are linked in.");
    cg_line(c, "//");
    cg_line(c, "// Device memory, one allocation of %" PRId64 " bytes%s:", u->map.total,
            g->shard_optimizer ? " and the optimizer state of this rank's slices" : "");
    cg_line(c, "//   %12" PRId64 "  step state (RtDevState)", u->map.state);
    cg_line(c, "//   %12" PRId64 "  the staged batch (%" PRId64 " bytes)", u->map.batch, u->map.batch_bytes);
    cg_line(c, "//   %12" PRId64 "  parameters (%" PRId64 " floats)", u->map.params, cg_half_params_from(g));
    if (g->n_half_params)
        cg_line(c, "//   %12" PRId64 "  frozen parameters in %s, the flat buffer's last %" PRId64 " (netc --frozen-half)",
                u->map.half_params, ir_dtype_name(cg_half_params_dtype(g)), g->n_half_params);
    cg_line(c, "//   %12" PRId64 "  activations and temporaries, from the memory plan (%" PRId64 " bytes)", u->map.arena,
            g->arena_bytes);
    cg_line(c, "//   %12" PRId64 "  partial sums (batch and layer norms, gradient norms, accuracy, bias gradients)", u->map.part);
    cg_line(c, "//   %12" PRId64 "  gradients (%" PRId64 " floats); an evaluation touches nothing from here on",
            u->map.grads, g->n_grad_floats);
    if (g->shard_optimizer)
        cg_line(c, "//   %12" PRId64 "  the slices of the buffers this rank updates (netc --shard-optimizer)",
                u->map.shard);
    else cg_line(c, "//   %12" PRId64 "  optimizer state", u->map.optstate);
    if (g->shard_optimizer)
        cg_line(c, "//   %12" PRId64 "  optimizer state of this rank's slices (allocated with the rest at start-up)",
                u->map.optstate);
    cg_line(c, "// and with the trainer's --accumulate, last, the step's summed gradients (%" PRId64 " floats)",
            g->n_grad_floats);
    cg_blank(c);
    cg_line(c, "#include <stddef.h>");
    cg_line(c, "#include <stdint.h>\n");
    cg_line(c, "#include \"netrt.h\"");
    cg_line(c, "#include \"netrt_cuda.h\"\n");
    cg_line(c, "// The arithmetic of matrix products and convolutions: netc --precision tf32 defines this");
    cg_line(c, "// as RT_MATH_TF32.");
    cg_line(c, "#ifndef NETC_MATH");
    cg_line(c, "#define NETC_MATH RT_MATH_FP32");
    cg_line(c, "#endif\n");
}

/* The kernels' enum and names, in the order of the images' table. */
static void emit_kernel_table(Cu *u, Cg *c) {
    cg_line(c, "// ---- kernels\n");
    cg_line(c, "// Their cubins and PTX, one per architecture of netc --arch, in NAME_images.c (NVRTC's");
    cg_line(c, "// output, written by netc), ending with a NULL entry.");
    cg_line(c, "extern const RtCudaImage netc_images[];\n");
    cg_open(c, "enum {");
    for (int k = 0; k < u->n_kernels; k++) cg_line(c, "K_%s,", u->kernels[k].name);
    cg_line(c, "N_KERNELS");
    cg_close(c, "};\n");
    cg_open(c, "static const char *const kernel_names[N_KERNELS] = {");
    for (int k = 0; k < u->n_kernels; k++) cg_line(c, "\"%s\",", u->kernels[k].name);
    cg_close(c, "};\n");
}

/* train() or eval(): `name`, whose body, the step's launches printed at depth 1, is `body`. */
static void emit_host_step(Cg *c, const char *name, const char *body) {
    cg_open(c, "static void %s(RtCuda *cu%s) {", name, strcmp(name, "train") == 0 ? ", RtStepPart part" : "");
    cg_line(c, "unsigned char *const base = rt_cuda_base(cu);");
    cg_line(c, "(void)base;");
    fputs(body, c->out);
    cg_close(c, "}\n");
}

/* --predict: output_to_host, the model's output as the evaluation step leaves it in the arena,
 * copied to the host by the runtime, into float32 in logical row-major order. */
static void emit_output_host(Cu *u, Cg *c) {
    const IrNode *y = u->g->output;
    if (!cg_has_output(u->g)) return;
    cg_line(c, "// ---- --predict: the model's output (%%%d, %s), copied from the device after an evaluation",
            y->id, ir_dtype_name(y->dtype));
    cg_line(c, "// batch, into float32 in logical row-major order\n");
    cg_open(c, "static void output_to_host(const void *device_bytes, float *out) {");
    cg_line(c, "const %s *v = device_bytes;", ir_dtype_ctype(y->dtype));
    cg_emit_output_convert(c, "out", "v");
    cg_close(c, "}\n");
}

/* The two descriptions rt_main reads: the device's (regions, kernels, step functions) and the model's. */
static void emit_host_models(Cu *u, Cg *c) {
    const IrGraph *g = u->g;
    cg_open(c, "static const RtCudaModel cuda_model = {");
    cg_line(c, ".images = netc_images,");
    cg_line(c, ".kernel_names = kernel_names,");
    cg_line(c, ".n_kernels = N_KERNELS,");
    cg_line(c, ".device_bytes = %" PRId64 ",", u->map.total);
    cg_line(c, ".eval_bytes = %" PRId64 ",", u->map.eval_end);
    cg_line(c, ".off_params = %" PRId64 ",", u->map.params);
    if (g->n_half_params) cg_line(c, ".off_half_params = %" PRId64 ",", u->map.half_params);
    cg_line(c, ".off_grads = %" PRId64 ",", u->map.grads);
    cg_line(c, ".off_optstate = %" PRId64 ",", u->map.optstate);
    cg_line(c, ".off_state = %" PRId64 ",", u->map.state);
    if (g->shard_optimizer) cg_line(c, ".off_shard = %" PRId64 ",", u->map.shard);
    cg_line(c, ".off_batch = %" PRId64 ",", u->map.batch);
    cg_line(c, ".batch_bytes = %" PRId64 ",", u->map.batch_bytes);
    cg_begin(c, ".off_input = {");
    for (int i = 0; i < g->n_inputs; i++) cg_put(c, "%s%" PRId64, i ? ", " : "", u->map.input[i]);
    cg_end(c, "%s},", g->n_inputs ? "" : "0");
    cg_line(c, ".math = NETC_MATH,");
    cg_line(c, ".plan = plan,");
    cg_line(c, ".train = train,");
    cg_line(c, ".eval = eval,");
    if (cg_has_output(g)) {
        cg_line(c, ".off_output = %" PRId64 ",", cu_dev_offset(u, g->output));
        cg_line(c, ".output_bytes = %" PRId64 ",", ir_numel(&g->output->shape) * ir_dtype_size(g->output->dtype));
        cg_line(c, ".output_to_host = output_to_host,");
    }
    if (g->distributed) cg_line(c, ".coll = &rt_cuda_nccl,");
    cg_close(c, "};\n");
    cg_open(c, "static const RtModel model = {");
    cg_emit_model_head(c);
    cg_line(c, ".arena_bytes = 64,");
    cg_emit_model_recipe(c);
    cg_line(c, ".device = &rt_cuda_device,");
    cg_line(c, ".device_model = &cuda_model,");
    cg_close(c, "};\n");
}

static void emit_host(Cu *u, FILE *o, const char *plan, const char *train, const char *eval) {
    const IrGraph *g = u->g;
    Cg c = {.g = g, .out = o};
    emit_host_header(u, &c);
    cg_line(&c, "// ---- model description\n");
    cg_emit_description(&c);
    cg_emit_buckets(&c);
    emit_kernel_table(u, &c);
    cg_line(&c, "// ---- library plans, built once at start-up\n");
    for (int i = 0; i < g->n; i++) {
        if (!u->planned[g->nodes[i]->id]) continue;
        const IrNode *n = g->nodes[i];
        if (n->op == OP_MATMUL && u->planned[n->id] == 2) /* a GELU epilogue and its fallback */
            cg_line(&c, "static RtGemmPlan *gemm%d, *gemm%d_plain;", n->id, n->id);
        else if (n->op == OP_MATMUL) cg_line(&c, "static RtGemmPlan *gemm%d;", n->id);
        else cg_line(&c, "static RtCudaConvPlan *conv%d;", n->id);
    }
    cg_blank(&c); /* whether or not plans were declared */
    cg_open(&c, "static void plan(RtCuda *cu) {");
    cg_line(&c, "(void)cu;");
    fputs(plan, o); /* printed at depth 1 */
    cg_close(&c, "}\n");
    cg_line(&c, "// ---- the training step: forward, backward, sums, optimizer");
    cg_line(&c, "//");
    cg_line(&c, "// `part`: RT_STEP_WHOLE, a step of one batch; with the trainer's --accumulate K, RT_STEP_SUM");
    cg_line(&c, "// for each of a step's first K - 1 batches (their gradients summed, no update) and");
    cg_line(&c, "// RT_STEP_LAST for its K-th (the sum added in and divided by K, the update).\n");
    emit_host_step(&c, "train", train);
    cg_line(&c, "// ---- evaluation: the forward pass with running statistics, dropout off\n");
    emit_host_step(&c, "eval", eval);
    emit_output_host(u, &c);
    cg_line(&c, "// ---- entry point\n");
    emit_host_models(u, &c);
    cg_line(&c, "int main(int argc, char **argv) { return rt_main(argc, argv, &model); }");
}

/* ---- the emit phases (codegen.h)
 *
 * Every phase writes into buffers: the kernels (in launch order, training step first), the
 * host's plan(), train() and eval() bodies. emit_model writes the files, the host program last,
 * because its kernel table needs every kernel's name. The images' table, netc_images, is the
 * target's kernel compiler's (compiler/driver/nvrtc.c), written once NVRTC has run. */
struct CgEmit {
    Cu u;
    FILE *trainer, *kernels; /* either may be NULL: that file is not written */
    char *kbuf, *pbuf, *tbuf, *ebuf;
    size_t ksize, psize, tsize, esize;
};

static CgEmit *cuda_begin(const IrGraph *g, FILE *trainer, FILE *kernels) {
    if (!g->loss) ICE("cuda: the graph has no loss");
    CgEmit *e = xcalloc(1, sizeof *e);
    Cu *u = &e->u;
    e->trainer = trainer, e->kernels = kernels;
    u->g = g;
    u->c = (Cg){.g = g, .at_slot = at_slot};
    u->c.decl = xcalloc((size_t)g->n + 1, 1);
    u->renum = xcalloc((size_t)g->n + 1, sizeof *u->renum);
    u->vec = xcalloc((size_t)g->n + 1, 1);
    u->vec_ids = xcalloc((size_t)g->n + 1, sizeof *u->vec_ids);
    u->c.done = xcalloc((size_t)g->n_groups + 1, 1);
    u->c.fold = xcalloc((size_t)g->n + 1, sizeof *u->c.fold); /* no folding on the GPU: cuDNN runs the convolution */
    u->planned = xcalloc((size_t)g->n + 1, 1);
    u->readers = xcalloc((size_t)g->n + 1, sizeof *u->readers);
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) u->readers[g->nodes[i]->in[k]->id]++;
    u->map = plan_memory(g);
    u->cu = open_buffer(&e->kbuf, &e->ksize, 0);
    u->plan = open_buffer(&e->pbuf, &e->psize, 1);
    u->step = open_buffer(&e->tbuf, &e->tsize, 1);
    u->step.g = g; /* the buckets whose sums it starts */
    return e;
}

static void cuda_step(CgEmit *e) { walk(&e->u, 0); }

/* The update, then the step counter: the last kernels of the training step. */
static void cuda_optimizer(CgEmit *e) {
    Cu *u = &e->u;
    cu_optimizer(u);
    if (u->g->shard_optimizer && u->g->n_grad_floats)
        cg_line(&u->step, "rt_cuda_gather_params(cu); // every rank's updated slices to every rank");
    cu_kernel_open(u);
    cg_line(&u->c, "ctx->state->step += 1;");
    cu_kernel_close(u, "step_advance", 1, 1, "the step counter");
}

static void cuda_eval(CgEmit *e) {
    fclose(e->u.step.out);
    e->u.step = open_buffer(&e->ebuf, &e->esize, 1);
    walk(&e->u, 1);
}

static int cuda_model(CgEmit *e) {
    Cu *u = &e->u;
    fclose(u->step.out);
    fclose(u->plan.out);
    fclose(u->cu.out);
    if (e->kernels) {
        emit_cu_prologue(u, e->kernels);
        fputs(e->kbuf, e->kernels);
    }
    if (e->trainer) emit_host(u, e->trainer, e->pbuf, e->tbuf, e->ebuf);
    for (int k = 0; k < u->n_kernels; k++) free(u->kernels[k].key);
    free(u->kernels), free(e->kbuf), free(e->pbuf), free(e->tbuf), free(e->ebuf);
    free(u->c.decl), free(u->c.done), free((void *)u->c.fold), free(u->planned), free(u->readers), free(u->renum);
    free(u->vec), free(u->vec_ids);
    int bad = (e->kernels && ferror(e->kernels)) || (e->trainer && ferror(e->trainer));
    free(e);
    return bad ? 1 : 0;
}

const CgBackend cg_cuda = {
    .name = "cuda",
    .description = "host C with CUDA C kernels (NVRTC), cuDNN and cuBLASLt; the step is one CUDA Graph",
    .precisions = 1u << CG_FP32 | 1u << CG_TF32 | 1u << CG_BF16 | 1u << CG_FP16,
    .fuse_reductions = 0,
    .krsc_filters = 1,
    .has_kernels = 1,
    .node_scratch = NULL, /* cuDNN and cuBLASLt bring their own workspace */
    .in_place = NULL,     /* every kernel writes a buffer of its own */
    .emit_begin = cuda_begin,
    .emit_step = cuda_step,
    .emit_optimizer = cuda_optimizer,
    .emit_eval = cuda_eval,
    .emit_model = cuda_model,
};
