// expert_parallel.c — the alltoall and allgather token exchanges of expert parallelism
// (see expert_parallel.h), and the growable buffers they compute in.
#include "core/device.h"
#include "moe/expert_parallel.h"
#include "moe/token_dispatcher.h"

#include "core/profile.h"
#include "core/timer.h"
#include "ops/ops_dispatch.h"

// Per MoE layer, from forward to backward: the rows this rank's experts computed.
typedef struct EpLayer {
    // alltoall: the sources of the rows computed here are S = ETP·P (EP size P) ranks, in
    // the order [ETP rank][EP rank] (S = P without expert tensor parallelism)
    int sources;
    int32_t *own_counts;   // (P·local) rows this rank received from EP rank s for local expert le, [s][le]
    int32_t *recv_counts;  // (S·local) the same of every ETP rank, [ETP rank][s][le] (own_counts without ETP)
    int32_t *offsets;      // (local + 1) first row of each local expert
    int32_t *sizes;        // (2P + ETP + 1) the exchange's sizes (moe_ep_layout), then in the same block
    int32_t *counts;       // (local) rows of each local expert; both downloaded at once into host_sizes:
    int32_t *host_sizes;   // host memory, and in it:
    int32_t *send_rows;    //   (P) alltoall: rows sent to each EP rank
    int32_t *recv_rows;    //   (P) alltoall: rows received from each EP rank
    int32_t *etp_rows;     //   (ETP) rows each ETP rank received over EP
    int32_t *host_counts;  //   (local) counts, for the grouped GEMMs' problem sizes
    int rows;              // rows computed here
    size_t row_capacity;
    real *rows_in, *row_probs, *rows_out;  // (rows,H), (rows), (rows,H)
    ExpertActs acts;                       // (rows,I) each; act the pass's shared one when act_shared
    int act_shared;                        // --recompute-modules moe_act (MoeDispatchContext.act_shared)
    // allgather: the routing of the whole group and the plan over its P·N tokens
    size_t choice_capacity;
    int32_t *topk_all, *kept_all;  // (P·N·k)
    real *probs_all;               // (P·N·k)
    DispatchPlan plan;             // row_of_choice (P·N·k), token_of_row (rows)
    // alltoall: the exchanges of the phase in flight (rows, probs) and when they started
    CommRequest inflight[2];
    double started;
} EpLayer;

// Scratch shared by the layers (not needed after the call that fills it).
struct EpBuffers {
    int gradients;                    // a backward pass's: the gradient buffers too
    size_t row_capacity;
    real *exchange, *exchange_probs;  // (rows,H), (rows): rows as they travel, [source][expert]
    real *own, *own_probs;            // (rows,H), (rows) with ETP: the rows that came over EP
    real *d_rows_out, *d_rows_in;     // (rows,H)
    real *d_row_probs;                // (rows)
    real *d_gate, *d_up, *d_act;      // (rows,I)
    size_t act_capacity;
    real *act;                        // (rows,I) --recompute-modules moe_act: every layer's SwiGLU product
    size_t token_capacity, choice_capacity;
    real *tokens_all;                 // (P·N,H) allgather: gathered inputs / partial sums
    real *choices_all;                // (P·N·k) allgather: prob gradients of every choice
    double comm_s;                    // in the exchanges' calls and waits (exposed)
    double hidden_s;                  // exchanges in flight while the caller computed other work
};

// ---- buffers -----------------------------------------------------------------------------------

// Capacity for `need` items: the current one, or exactly `need` when it is larger (each
// buffer is asked for its bound, ep_max_rows, or its exact size: it grows only when the
// micro-batch does).
static size_t grown(size_t capacity, size_t need) { return need <= capacity ? capacity : need; }

// Exchange buffers and the per-layer plan are tensor memory (core/device.h): ops read them.
static void resize(real **buf, size_t count) {
    device_free(*buf);
    *buf = device_calloc(MT_MAX(count, 1), sizeof(real));
}

static void resize_ints(int32_t **buf, size_t count) {
    device_free(*buf);
    *buf = device_calloc(MT_MAX(count, 1), sizeof(int32_t));
}

static int etp_size(const ExpertParallel *ep) { return ep->etp ? ep->etp->size : 1; }

size_t ep_max_rows(const ExpertParallel *ep, const EpExchangeShape *s) {
    size_t sources = (size_t)etp_size(ep) * (size_t)ep->size;  // alltoall's sources; allgather's group
    int padded = s->capacity > 0 && ep->dispatcher == DISPATCH_ALLTOALL;  // allgather's plan is never padded
    size_t local = (size_t)ep->local, per_source = (size_t)s->tokens * MT_MIN(s->topk, ep->local);
    size_t per_expert = s->expert_limit > 0 ? (size_t)s->expert_limit : (size_t)s->tokens;  // kept choices at most
    if (s->align > 1) {
        per_source = MT_MIN(per_source + local * (s->align - 1), local * s->tokens);
        per_expert = (size_t)dispatch_aligned_rows((int)per_expert, s->tokens, s->align);
    }
    per_source = MT_MIN(per_source, local * per_expert);
    if (padded) per_source = local * (size_t)s->capacity;
    return sources * per_source;
}

// The exchange's shape for a layer's micro-batch.
static EpExchangeShape exchange_shape(const MoeDispatchContext *ctx, const MoeActs *ma) {
    return (EpExchangeShape){.tokens = ma->plan.N, .topk = ma->plan.k, .align = ma->plan.align,
                             .capacity = ma->route.capacity,
                             .expert_limit = ma->route.expert_limit, .hidden = ctx->hidden, .moe_ffn = ctx->moe_ffn, .act_shared = ctx->act_shared,
                             .act_store = ctx->act_store, .gate_up_store = ctx->gate_up_store};
}

// Bytes per row of the layer state (rows_in, rows_out, row_probs, gate, up, act as stored) and
// reals of a pass's scratch (exchange, own with ETP, the gradients, the shared act); the allgather
// dispatcher's gathered tokens and choices besides.
static double layer_bytes_per_row(const EpExchangeShape *s) {
    size_t act_bytes = s->act_shared ? 0 : (size_t)s->moe_ffn * storage_bytes(s->act_store);
    size_t gate_up_bytes = 2 * (size_t)s->moe_ffn * storage_bytes(s->gate_up_store);
    return (double)(2 * (size_t)s->hidden + 1) * sizeof(real) + (double)(gate_up_bytes + act_bytes);
}

static size_t buffers_reals_per_row(const ExpertParallel *ep, const EpExchangeShape *s, int gradients) {
    size_t H = s->hidden, I = s->moe_ffn;
    return (H + 1) * (ep->etp ? 2 : 1) + (gradients ? 2 * H + 1 + I + 2 * storage_reals(I, s->act_store) : 0) +
           (s->act_shared ? storage_reals(I, s->act_store) : 0);
}

static size_t gathered_tokens(const ExpertParallel *ep, const EpExchangeShape *s) {
    return ep->dispatcher == DISPATCH_ALLGATHER ? (size_t)etp_size(ep) * ep->size * s->tokens : 0;
}

double ep_layer_bytes(const ExpertParallel *ep, const EpExchangeShape *s) {
    size_t choices = gathered_tokens(ep, s) * s->topk;  // topk_all, kept_all, probs_all, the plan's two
    return (double)ep_max_rows(ep, s) * layer_bytes_per_row(s) + (double)choices * 5 * sizeof(int32_t);
}

double ep_buffers_bytes(const ExpertParallel *ep, const EpExchangeShape *s, int gradients) {
    size_t tokens = gathered_tokens(ep, s);
    return (double)ep_max_rows(ep, s) * buffers_reals_per_row(ep, s, gradients) * sizeof(real) +
           (double)tokens * (s->hidden + s->topk) * sizeof(real);
}

// The layer's rows and saved activations, made for the bound of its micro-batch (the SwiGLU
// product too unless the pass's shared one serves: shared_act); `rows` (this exchange's) is
// within it.
static void layer_reserve_rows(const MoeDispatchContext *ctx, EpLayer *el, const MoeActs *ma, size_t rows) {
    EpExchangeShape shape = exchange_shape(ctx, ma);
    size_t bound = ep_max_rows(ctx->ep, &shape);
    if (rows > bound)
        mt_die("internal error: %zu expert rows, more than the bound of %zu (please report)", rows, bound);
    size_t cap = grown(el->row_capacity, bound), H = ctx->hidden, I = ctx->moe_ffn;
    el->act_shared = ctx->act_shared;
    el->acts.act_store = ctx->act_store;
    el->acts.gate_up_store = ctx->gate_up_store;
    el->acts.d_gate_up_store = ctx->act_store;
    if (cap == el->row_capacity) return;
    el->row_capacity = cap;
    resize(&el->rows_in, cap * H);
    resize(&el->row_probs, cap);
    resize(&el->rows_out, cap * H);
    resize(&el->acts.gate, storage_reals(cap * I, ctx->gate_up_store));
    resize(&el->acts.up, storage_reals(cap * I, ctx->gate_up_store));
    if (!el->act_shared) resize(&el->acts.act, storage_reals(cap * I, ctx->act_store));
}

static void layer_reserve_choices(EpLayer *el, size_t choices) {
    size_t cap = grown(el->choice_capacity, choices);
    if (cap == el->choice_capacity) return;
    el->choice_capacity = cap;
    resize_ints(&el->topk_all, cap);
    resize_ints(&el->kept_all, cap);
    resize(&el->probs_all, cap);
    resize_ints(&el->plan.row_of_choice, cap);
    resize_ints(&el->plan.token_of_row, cap);  // a plan of these choices has at most as many rows
}

// Ints of the exchange's sizes: rows to and from each EP rank, of each ETP rank, all rows.
static size_t sizes_count(const ExpertParallel *ep) { return 2 * (size_t)ep->size + etp_size(ep) + 1; }

static EpLayer *ep_layer(MoeActs *ma, const ExpertParallel *ep, int E) {
    if (ma->ep) return ma->ep;
    EpLayer *el = mt_calloc(1, sizeof(EpLayer));
    el->sources = etp_size(ep) * ep->size;
    el->own_counts = device_calloc((size_t)ep->size * ep->local, sizeof(int32_t));
    el->recv_counts = ep->etp ? device_calloc((size_t)el->sources * ep->local, sizeof(int32_t)) : el->own_counts;
    el->sizes = device_calloc(sizes_count(ep) + ep->local, sizeof(int32_t));
    el->counts = el->sizes + sizes_count(ep);
    el->host_sizes = mt_calloc(sizes_count(ep) + ep->local, sizeof(int32_t));
    el->send_rows = el->host_sizes;
    el->recv_rows = el->host_sizes + ep->size;
    el->etp_rows = el->host_sizes + 2 * ep->size;
    el->host_counts = el->host_sizes + sizes_count(ep);
    el->offsets = device_calloc(ep->local + 1, sizeof(int32_t));
    el->plan.rows_per_expert = device_calloc(E, sizeof(int32_t));
    el->plan.expert_offsets = device_calloc(E + 1, sizeof(int32_t));
    ma->ep = el;
    return el;
}

void ep_layer_prepare(MoeActs *ma, const ExpertParallel *ep, int experts) { ep_layer(ma, ep, experts); }

void ep_layer_free(MoeActs *ma) {
    EpLayer *el = ma->ep;
    if (!el) return;
    if (el->recv_counts != el->own_counts) device_free(el->recv_counts);
    free(el->host_sizes);
    dispatch_plan_free(&el->plan);
    void *owned[] = {el->own_counts, el->sizes, el->offsets,
                     el->rows_in, el->row_probs, el->rows_out, el->acts.gate, el->acts.up,
                     el->act_shared ? NULL : el->acts.act,
                     el->topk_all, el->kept_all, el->probs_all, el->plan.rows_per_expert, el->plan.expert_offsets,
                     el->plan.row_of_choice, el->plan.token_of_row};
    for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++) device_free(owned[i]);
    free(el);
    ma->ep = NULL;
}

struct EpBuffers *ep_buffers_new(int gradients) {
    struct EpBuffers *b = mt_calloc(1, sizeof(struct EpBuffers));
    b->gradients = gradients;
    return b;
}

void ep_buffers_free(struct EpBuffers *b) {
    if (!b) return;
    real *owned[] = {b->exchange, b->exchange_probs, b->own, b->own_probs, b->d_rows_out, b->d_rows_in,
                     b->d_row_probs, b->d_gate, b->d_up, b->d_act, b->act, b->tokens_all, b->choices_all};
    for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++) device_free(owned[i]);
    free(b);
}

// --recompute-modules moe_act: the pass's SwiGLU product buffer every layer shares, grown to rows.
static real *shared_act(const MoeDispatchContext *ctx, size_t rows) {
    struct EpBuffers *b = ctx->buffers;
    size_t cap = grown(b->act_capacity, storage_reals(rows * ctx->moe_ffn, ctx->act_store));
    if (cap != b->act_capacity) {
        b->act_capacity = cap;
        resize(&b->act, cap);
    }
    return b->act;
}

static struct EpBuffers *buffers_for_rows(const MoeDispatchContext *ctx, size_t rows) {
    struct EpBuffers *b = ctx->buffers;
    size_t cap = grown(b->row_capacity, rows), H = ctx->hidden, I = ctx->moe_ffn;
    if (cap == b->row_capacity) return b;
    b->row_capacity = cap;
    resize(&b->exchange, cap * H);
    resize(&b->exchange_probs, cap);
    if (ctx->ep->etp) {
        resize(&b->own, cap * H);
        resize(&b->own_probs, cap);
    }
    if (!b->gradients) return b;
    resize(&b->d_rows_out, cap * H);
    resize(&b->d_rows_in, cap * H);
    resize(&b->d_row_probs, cap);
    resize(&b->d_gate, storage_reals(cap * I, ctx->act_store));  // stored as the SwiGLU product (experts.h)
    resize(&b->d_up, storage_reals(cap * I, ctx->act_store));
    resize(&b->d_act, cap * I);
    return b;
}

// Room for the P·N gathered tokens and their P·N·k choices.
static struct EpBuffers *buffers_for_tokens(const MoeDispatchContext *ctx, size_t tokens, size_t choices) {
    struct EpBuffers *b = ctx->buffers;
    size_t cap = grown(b->token_capacity, tokens);
    if (cap != b->token_capacity) {
        b->token_capacity = cap;
        resize(&b->tokens_all, cap * ctx->hidden);
    }
    cap = grown(b->choice_capacity, choices);
    if (cap != b->choice_capacity) {
        b->choice_capacity = cap;
        resize(&b->choices_all, cap);
    }
    return b;
}

double ep_take_comm_seconds(struct EpBuffers *b) {
    if (!b) return 0;
    double s = b->comm_s;
    b->comm_s = 0;
    return s;
}

double ep_take_hidden_seconds(struct EpBuffers *b) {
    if (!b) return 0;
    double s = b->hidden_s;
    b->hidden_s = 0;
    return s;
}

// counts (local) of this rank's experts in tensor memory and host_counts the same in host memory, `rows` in all
static ExpertShape local_shape(const MoeDispatchContext *ctx, const int32_t *counts, const int32_t *host_counts,
                               int rows) {
    return (ExpertShape){.groups = ctx->ep->local, .H = ctx->hidden, .I = ctx->moe_ffn, .counts = counts,
                         .host_counts = host_counts, .rows = rows, .in_store = ctx->rows_store};
}

// ---- alltoall ------------------------------------------------------------------------------------

// Rows of `width` reals: send_rows[q] rows (back to back in send) go to rank q;
// recv_rows[q] rows from rank q land back to back in recv. In flight in *req when given,
// else complete on return.
static void exchange_rows(const MoeDispatchContext *ctx, const real *send, const int32_t *send_rows, real *recv,
                          const int32_t *recv_rows, int width, CommRequest *req) {
    const Comm *g = ctx->ep->comm;
    int P = g->size;
    size_t *counts = mt_malloc(4 * (size_t)P * sizeof(size_t));
    size_t *send_counts = counts, *send_displs = counts + P, *recv_counts = counts + 2 * P, *recv_displs = counts + 3 * P;
    size_t sent = 0, received = 0;
    for (int q = 0; q < P; q++) {
        send_counts[q] = (size_t)send_rows[q] * width;
        recv_counts[q] = (size_t)recv_rows[q] * width;
        send_displs[q] = sent;
        recv_displs[q] = received;
        sent += send_counts[q];
        received += recv_counts[q];
    }
    PROF_SCOPE(PROF_EXPERT_COMM);
    double t0 = now_seconds();
    if (req) comm_ialltoall_v(g, send, send_counts, send_displs, recv, recv_counts, recv_displs, req);
    else comm_alltoall_v(g, send, send_counts, send_displs, recv, recv_counts, recv_displs);
    ctx->buffers->comm_s += now_seconds() - t0;
    free(counts);
}

// The phase's exchanges have been started (in flight from now).
static void mark_started(EpLayer *el) { el->started = now_seconds(); }

// Waits for the phase's exchanges: the time since they started counts as hidden, the wait
// as exposed.
static void finish_exchanges(const MoeDispatchContext *ctx, EpLayer *el) {
    PROF_SCOPE(PROF_EXPERT_COMM);
    double t0 = now_seconds();
    ctx->buffers->hidden_s += t0 - el->started;
    for (int i = 0; i < 2; i++) comm_wait(&el->inflight[i]);
    ctx->buffers->comm_s += now_seconds() - t0;
}

// Elements of `width` per row, for the rows[q] of each rank q of a group.
static size_t *row_counts(const int32_t *rows, int P, int width) {
    size_t *counts = mt_malloc((size_t)P * sizeof(size_t));
    for (int q = 0; q < P; q++) counts[q] = (size_t)rows[q] * width;
    return counts;
}

// Expert tensor parallelism, over the ETP group (blocks of the rows each of its ranks received
// over EP, in ETP rank order): GATHER_ROWS all-gathers them, so every slice of the experts
// sees every row; SUM_SLICES reduce-scatters all rows' partial results into each rank's own.
typedef enum { GATHER_ROWS, SUM_SLICES } EtpCollective;

static void over_etp(const MoeDispatchContext *ctx, const EpLayer *el, EtpCollective op, const real *send,
                     real *recv, int width) {
    const Comm *etp = ctx->ep->etp;
    size_t *counts = row_counts(el->etp_rows, etp->size, width);
    PROF_SCOPE(PROF_EXPERT_COMM);
    double t0 = now_seconds();
    if (op == GATHER_ROWS) comm_allgather_v(etp, send, recv, counts);
    else comm_reduce_scatter_v(etp, send, recv, counts);
    ctx->buffers->comm_s += now_seconds() - t0;
    free(counts);
}

// Rows in this rank's plan order -> arrived, [source][local expert] over all S sources:
// over EP to their expert's rank (in flight in *req), then with ETP gathered from its ETP
// ranks (through own; then complete on return).
static void rows_to_experts(const MoeDispatchContext *ctx, const EpLayer *el, const real *send, real *arrived,
                            real *own, int width, CommRequest *req) {
    if (!ctx->ep->etp) {
        exchange_rows(ctx, send, el->send_rows, arrived, el->recv_rows, width, req);
        return;
    }
    exchange_rows(ctx, send, el->send_rows, own, el->recv_rows, width, NULL);
    over_etp(ctx, el, GATHER_ROWS, own, arrived, width);
}

// The way back: arrived rows (with ETP partial over the FFN slices, summed on the way) ->
// back, in this rank's plan order (in flight in *req).
static void rows_from_experts(const MoeDispatchContext *ctx, const EpLayer *el, const real *arrived, real *back,
                              real *own, int width, CommRequest *req) {
    if (!ctx->ep->etp) {
        exchange_rows(ctx, arrived, el->recv_rows, back, el->send_rows, width, req);
        return;
    }
    over_etp(ctx, el, SUM_SLICES, arrived, own, width);
    exchange_rows(ctx, own, el->recv_rows, back, el->send_rows, width, req);
}

// ---- bf16 transport (ctx->bf16_rows): rows only the experts' bf16-input GEMMs read --------------
// The sender packs its rows into the front of `scratch` (the pass's exchange buffer, free until
// they arrive); they arrive packed in the back half of `dest`, the buffer the caller sorts
// them into, where nothing else is written until then. On arrival they are widened into
// scratch, and sorted from there into dest as fp32 rows are.

// Where the packed rows land: the back half of dest (capacity rows of H).
static real *packed_arrival(real *dest, size_t capacity, int H) { return dest + capacity * (size_t)H / 2; }

// rows_to_experts of the rows at send (this rank's plan order), H wide, at half the bytes.
static void rows_to_experts_bf16(const MoeDispatchContext *ctx, const EpLayer *el, const real *send, real *scratch,
                                 real *dest, size_t dest_capacity, real *own, int H, CommRequest *req) {
    size_t sent = 0;
    for (int q = 0; q < ctx->ep->comm->size; q++) sent += (size_t)el->send_rows[q];
    MT_ASSERT(send != dest && sent <= 2 * ctx->buffers->row_capacity);
    bf16_pack(scratch, send, sent * H);
    rows_to_experts(ctx, el, scratch, packed_arrival(dest, dest_capacity, H), own, H / 2, req);
}

// The arrived rows, widened into scratch (arrival order, as rows_to_experts leaves fp32 rows).
static void bf16_arrival(const EpLayer *el, real *scratch, real *dest, size_t dest_capacity, int H) {
    bf16_unpack(scratch, packed_arrival(dest, dest_capacity, H), (size_t)el->rows * H);
}

// This rank's rows per local expert from each EP rank (own_counts) start on their way;
// once they are here, with ETP those of its ETP ranks (recv_counts) are gathered.
static void start_counts(const MoeDispatchContext *ctx, EpLayer *el, const DispatchPlan *plan) {
    PROF_SCOPE(PROF_EXPERT_COMM);
    double t0 = now_seconds();
    comm_ialltoall_int32(ctx->ep->comm, plan->rows_per_expert, el->own_counts, ctx->ep->local, &el->inflight[0]);
    ctx->buffers->comm_s += now_seconds() - t0;
    mark_started(el);
}

static void finish_counts(const MoeDispatchContext *ctx, EpLayer *el) {
    const ExpertParallel *ep = ctx->ep;
    size_t own = (size_t)ep->size * ep->local;
    finish_exchanges(ctx, el);
    PROF_SCOPE(PROF_EXPERT_COMM);
    double t0 = now_seconds();
    if (ep->etp) comm_allgather_int32(ep->etp, el->own_counts, el->recv_counts, own);  // else the same block
    ctx->buffers->comm_s += now_seconds() - t0;
}

// From the exchanged counts (an op): rows sent to / received from each EP rank, rows each
// ETP rank received, and each local expert's rows and first row once sorted expert-major;
// the sizes come to the host in the layer pass's one download of them.
static void alltoall_layout(EpLayer *el, const DispatchPlan *plan, const ExpertParallel *ep) {
    moe_ep_layout(el->counts, el->offsets, el->sizes, el->own_counts, el->recv_counts, plan->expert_offsets, ep->size,
                  ep->local, el->sources);
    device_download(el->host_sizes, el->sizes, (sizes_count(ep) + ep->local) * sizeof(int32_t));
    el->rows = el->host_sizes[sizes_count(ep) - 1];
}

// Arrival order [source s][local expert le] <-> expert-major [le][s] (to_expert_major 0:
// the reverse). Segments keep their rows' order, so the reverse is exact.
static void sort_segments(real *dst, const real *src, const EpLayer *el, const ExpertParallel *ep, int width,
                          int to_expert_major) {
    moe_sort_segments(dst, src, el->recv_counts, el->offsets, el->sources, ep->local, width, to_expert_major);
}

// The rows this rank's experts compute, from the exchange's layer state.
static ExpertRows layer_rows(const MoeDispatchContext *ctx, EpLayer *el, const int32_t *counts,
                             const int32_t *host_counts) {
    if (el->act_shared) el->acts.act = shared_act(ctx, el->row_capacity);
    return (ExpertRows){.rows_in = el->rows_in, .row_probs = el->row_probs, .rows_out = el->rows_out,
                        .acts = &el->acts, .shape = local_shape(ctx, counts, host_counts, el->rows)};
}

// The exchange's gradient buffers (scratch shared by the layers).
static void set_backward_rows(ExpertRows *rows, struct EpBuffers *b) {
    expert_rows_set_backward(rows, b->d_rows_out, b->d_rows_in, b->d_row_probs, b->d_gate, b->d_up, b->d_act);
}

static void alltoall_dispatch(const MoeDispatchContext *ctx, MoeActs *ma, const void *x, ExpertRows *rows) {
    local_dispatch_rows(ctx, ma, x);
    start_counts(ctx, ep_layer(ma, ctx->ep, ctx->experts), &ma->plan);
}

// The counts are here: the rows and probs start for their experts.
static void alltoall_dispatch_exchange(const MoeDispatchContext *ctx, MoeActs *ma) {
    const ExpertParallel *ep = ctx->ep;
    int H = ctx->hidden;
    EpLayer *el = ma->ep;
    finish_counts(ctx, el);
    alltoall_layout(el, &ma->plan, ep);
    layer_reserve_rows(ctx, el, ma, (size_t)el->rows);
    struct EpBuffers *b = buffers_for_rows(ctx, el->row_capacity);
    if (ctx->rows_store == STORE_BF16)  // already bf16: they travel and are sorted as they are
        rows_to_experts(ctx, el, ma->rows_in, packed_arrival(el->rows_in, el->row_capacity, H), b->own, H / 2,
                        &el->inflight[0]);
    else if (ctx->bf16_rows)
        rows_to_experts_bf16(ctx, el, ma->rows_in, b->exchange, el->rows_in, el->row_capacity, b->own, H, &el->inflight[0]);
    else rows_to_experts(ctx, el, ma->rows_in, b->exchange, b->own, H, &el->inflight[0]);
    rows_to_experts(ctx, el, ma->row_probs, b->exchange_probs, b->own_probs, 1, &el->inflight[1]);
    mark_started(el);
}

static void alltoall_dispatch_finish(const MoeDispatchContext *ctx, MoeActs *ma, ExpertRows *rows) {
    EpLayer *el = ma->ep;
    struct EpBuffers *b = ctx->buffers;
    finish_exchanges(ctx, el);
    if (ctx->rows_store == STORE_BF16) {  // kept bf16: sorted from the back half into the front
        sort_segments(el->rows_in, packed_arrival(el->rows_in, el->row_capacity, ctx->hidden), el, ctx->ep,
                      ctx->hidden / 2, 1);
    } else {
        if (ctx->bf16_rows) bf16_arrival(el, b->exchange, el->rows_in, el->row_capacity, ctx->hidden);
        sort_segments(el->rows_in, b->exchange, el, ctx->ep, ctx->hidden, 1);
    }
    sort_segments(el->row_probs, b->exchange_probs, el, ctx->ep, 1, 1);
    *rows = layer_rows(ctx, el, el->counts, el->host_counts);
}

static void alltoall_combine(const MoeDispatchContext *ctx, MoeActs *ma, const ExpertRows *rows, real *out) {
    EpLayer *el = ma->ep;
    int H = ctx->hidden;
    struct EpBuffers *b = buffers_for_rows(ctx, el->row_capacity);
    sort_segments(b->exchange, rows->rows_out, el, ctx->ep, H, 0);
    rows_from_experts(ctx, el, b->exchange, ma->rows_out, b->own, H, &el->inflight[0]);
    mark_started(el);
}

static void alltoall_combine_finish(const MoeDispatchContext *ctx, MoeActs *ma, real *out) {
    finish_exchanges(ctx, ma->ep);
    combine_forward(out, ma->rows_out, &ma->plan, ctx->hidden, 0);
}

// combine backward = dispatch of the output gradient, then the same trip as the inputs
static void alltoall_combine_backward(const MoeDispatchContext *ctx, MoeActs *ma, const MoeBackwardBuffers *grads,
                                      const real *d_out, ExpertRows *rows) {
    EpLayer *el = ma->ep;
    int H = ctx->hidden;
    struct EpBuffers *b = buffers_for_rows(ctx, el->row_capacity);
    dispatch_forward(grads->d_rows_out, STORE_FP32, NULL, d_out, STORE_FP32, NULL, &ma->plan, H);
    if (ctx->bf16_rows)
        rows_to_experts_bf16(ctx, el, grads->d_rows_out, b->exchange, b->d_rows_out, b->row_capacity, b->own, H,
                             &el->inflight[0]);
    else rows_to_experts(ctx, el, grads->d_rows_out, b->exchange, b->own, H, &el->inflight[0]);
    mark_started(el);
}

static void alltoall_combine_backward_finish(const MoeDispatchContext *ctx, MoeActs *ma, ExpertRows *rows) {
    struct EpBuffers *b = ctx->buffers;
    finish_exchanges(ctx, ma->ep);
    if (ctx->bf16_rows) bf16_arrival(ma->ep, b->exchange, b->d_rows_out, b->row_capacity, ctx->hidden);
    sort_segments(b->d_rows_out, b->exchange, ma->ep, ctx->ep, ctx->hidden, 1);
    set_backward_rows(rows, b);
}

// the input and prob gradients return as the outputs did (with ETP summed over the slices)
static void alltoall_dispatch_backward(const MoeDispatchContext *ctx, MoeActs *ma, const MoeBackwardBuffers *grads,
                                       const ExpertRows *rows) {
    const ExpertParallel *ep = ctx->ep;
    EpLayer *el = ma->ep;
    int H = ctx->hidden;
    struct EpBuffers *b = ctx->buffers;
    sort_segments(b->exchange, rows->d_rows_in, el, ep, H, 0);
    rows_from_experts(ctx, el, b->exchange, grads->d_rows_in, b->own, H, &el->inflight[0]);
    sort_segments(b->exchange_probs, rows->d_row_probs, el, ep, 1, 0);
    rows_from_experts(ctx, el, b->exchange_probs, grads->d_row_probs, b->own_probs, 1, &el->inflight[1]);
    mark_started(el);
}

static void alltoall_dispatch_backward_finish(const MoeDispatchContext *ctx, MoeActs *ma,
                                              const MoeBackwardBuffers *grads) {
    finish_exchanges(ctx, ma->ep);
    dispatch_backward(grads->d_x, grads->d_choice_probs, grads->d_rows_in, grads->d_row_probs, &ma->plan, ctx->hidden);
}

const TokenDispatcher TOKEN_DISPATCHER_ALLTOALL = {
    .name = "alltoall", .dispatch = alltoall_dispatch, .dispatch_exchange = alltoall_dispatch_exchange,
    .dispatch_finish = alltoall_dispatch_finish,
    .combine = alltoall_combine, .combine_finish = alltoall_combine_finish,
    .combine_backward = alltoall_combine_backward, .combine_backward_finish = alltoall_combine_backward_finish,
    .dispatch_backward = alltoall_dispatch_backward, .dispatch_backward_finish = alltoall_dispatch_backward_finish};

// ---- allgather -----------------------------------------------------------------------------------

// x (N, H) of every rank of the group gathered into all (P·N, H); returns how all is stored.
// x stored bf16 (ctx->x_store) is gathered as it is; else as bf16 through the pass's exchange
// buffer when ctx->bf16_rows (the gathered tokens become expert rows, read only by the experts'
// GEMMs) and the buffer, made for the layer's bound of rows, holds the packed gather and this
// rank's packed tokens; else as they are.
int ep_gather_packs_bf16(const ExpertParallel *ep, const EpExchangeShape *s) {
    return ep_max_rows(ep, s) * 2 >= ((size_t)ep->gather->size + 1) * (size_t)s->tokens;
}

static Storage gather_tokens(const MoeDispatchContext *ctx, const MoeActs *ma, const void *x, real *all, int N) {
    const Comm *g = ctx->ep->gather;
    size_t block = (size_t)N * ctx->hidden;
    EpExchangeShape shape = exchange_shape(ctx, ma);
    if (ctx->x_store == STORE_BF16) {  // H even (layout.h norm_store)
        comm_allgather(g, x, all, block / 2);
        return STORE_BF16;
    }
    if (!ctx->bf16_rows || !ep_gather_packs_bf16(ctx->ep, &shape)) {
        comm_allgather(g, x, all, block);
        return STORE_FP32;
    }
    struct EpBuffers *b = buffers_for_rows(ctx, ep_max_rows(ctx->ep, &shape));
    real *gathered = b->exchange, *mine = b->exchange + (size_t)g->size * block / 2;
    bf16_pack(mine, x, block);
    comm_allgather(g, mine, gathered, block / 2);
    bf16_unpack(all, gathered, (size_t)g->size * block);
    return STORE_FP32;
}

static void allgather_dispatch(const MoeDispatchContext *ctx, MoeActs *ma, const void *x, ExpertRows *rows) {
    const ExpertParallel *ep = ctx->ep;
    const Comm *g = ep->gather;
    int P = g->size, N = ma->plan.N, k = ma->plan.k, E = ctx->experts, H = ctx->hidden;
    size_t tokens = (size_t)P * N, choices = tokens * k;
    EpLayer *el = ep_layer(ma, ep, E);
    layer_reserve_choices(el, choices);
    struct EpBuffers *b = buffers_for_tokens(ctx, tokens, choices);
    Storage tokens_store;
    {
        PROF_SCOPE(PROF_EXPERT_COMM);
        double t0 = now_seconds();
        tokens_store = gather_tokens(ctx, ma, x, b->tokens_all, N);
        comm_allgather_int32(g, ma->route.topk_idx, el->topk_all, (size_t)N * k);
        comm_allgather_int32(g, ma->route.kept, el->kept_all, (size_t)N * k);
        comm_allgather(g, ma->route.topk_probs, el->probs_all, (size_t)N * k);
        ctx->buffers->comm_s += now_seconds() - t0;
    }
    // keep the choices of this rank's experts: the plan gives the others no rows
    moe_keep_local_choices(el->kept_all, el->topk_all, choices, ep->first, ep->local);
    el->plan.N = (int)tokens;
    el->plan.k = k;
    el->plan.E = E;
    dispatch_plan(&el->plan, el->topk_all, el->kept_all, 0);
    el->rows = el->plan.rows;
    layer_reserve_rows(ctx, el, ma, (size_t)el->rows);
    dispatch_forward(el->rows_in, ctx->rows_store, el->row_probs, b->tokens_all, tokens_store, el->probs_all, &el->plan,
                     H);
    *rows = layer_rows(ctx, el, el->plan.rows_per_expert + ep->first,  // rows start at 0
                       el->plan.host_rows_per_expert + ep->first);
}

static void allgather_combine(const MoeDispatchContext *ctx, MoeActs *ma, const ExpertRows *rows, real *out) {
    const Comm *g = ctx->ep->gather;
    EpLayer *el = ma->ep;
    int N = ma->plan.N, H = ctx->hidden;
    struct EpBuffers *b = ctx->buffers;
    combine_forward(b->tokens_all, rows->rows_out, &el->plan, H, 0);  // this rank's part of every token
    PROF_SCOPE(PROF_EXPERT_COMM);
    double t1 = now_seconds();
    comm_reduce_scatter(g, b->tokens_all, out, (size_t)N * H);
    ctx->buffers->comm_s += now_seconds() - t1;
}

static void allgather_combine_backward(const MoeDispatchContext *ctx, MoeActs *ma, const MoeBackwardBuffers *grads,
                                       const real *d_out, ExpertRows *rows) {
    const Comm *g = ctx->ep->gather;
    EpLayer *el = ma->ep;
    int P = g->size, N = ma->plan.N, k = ma->plan.k, H = ctx->hidden;
    struct EpBuffers *b = buffers_for_tokens(ctx, (size_t)P * N, (size_t)P * N * k);
    buffers_for_rows(ctx, el->row_capacity);
    {
        PROF_SCOPE(PROF_EXPERT_COMM);
        double t0 = now_seconds();
        gather_tokens(ctx, ma, d_out, b->tokens_all, N);
        ctx->buffers->comm_s += now_seconds() - t0;
    }
    dispatch_forward(b->d_rows_out, STORE_FP32, NULL, b->tokens_all, STORE_FP32, NULL, &el->plan, H);
    set_backward_rows(rows, b);
}

static void allgather_dispatch_backward(const MoeDispatchContext *ctx, MoeActs *ma, const MoeBackwardBuffers *grads,
                                        const ExpertRows *rows) {
    const Comm *g = ctx->ep->gather;
    EpLayer *el = ma->ep;
    int N = ma->plan.N, k = ma->plan.k, H = ctx->hidden;
    struct EpBuffers *b = ctx->buffers;
    // 0 in choices_all for other ranks' experts
    dispatch_backward(b->tokens_all, b->choices_all, rows->d_rows_in, rows->d_row_probs, &el->plan, H);
    PROF_SCOPE(PROF_EXPERT_COMM);
    double t1 = now_seconds();
    comm_reduce_scatter(g, b->tokens_all, grads->d_x, (size_t)N * H);
    comm_reduce_scatter(g, b->choices_all, grads->d_choice_probs, (size_t)N * k);
    ctx->buffers->comm_s += now_seconds() - t1;
}

const TokenDispatcher TOKEN_DISPATCHER_ALLGATHER = {.name = "allgather", .dispatch = allgather_dispatch,
                                                    .combine = allgather_combine,
                                                    .combine_backward = allgather_combine_backward,
                                                    .dispatch_backward = allgather_dispatch_backward};
