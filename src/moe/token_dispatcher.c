// token_dispatcher.c — the table of token dispatchers and the local one (every expert on
// this rank): a permute before the experts, the reverse after.
#include "moe/token_dispatcher.h"

const TokenDispatcher *token_dispatcher_of(const ExpertParallel *ep) {
    if (!ep->comm) return &TOKEN_DISPATCHER_LOCAL;  // every expert here, whole
    return ep->dispatcher == DISPATCH_ALLGATHER ? &TOKEN_DISPATCHER_ALLGATHER : &TOKEN_DISPATCHER_ALLTOALL;
}

void expert_rows_set_backward(ExpertRows *rows, real *d_rows_out, real *d_rows_in, real *d_row_probs, real *gate,
                              real *up, real *act) {
    rows->d_rows_out = d_rows_out;
    rows->d_rows_in = d_rows_in;
    rows->d_row_probs = d_row_probs;
    rows->scratch_gate = gate;
    rows->scratch_up = up;
    rows->scratch_act = act;
}

void local_dispatch_rows(const MoeDispatchContext *ctx, MoeActs *ma, const void *x) {
    // the router's report already holds each expert's kept choices of these tokens
    dispatch_plan_known(&ma->plan, ma->route.topk_idx, ma->route.kept, ma->route.capacity,
                        router_host_tokens_per_expert(&ma->route));
    dispatch_forward(ma->rows_in, ctx->rows_store, ma->row_probs, x, ctx->x_store, ma->route.topk_probs, &ma->plan,
                     ctx->hidden);
}

static void local_dispatch(const MoeDispatchContext *ctx, MoeActs *ma, const void *x, ExpertRows *rows) {
    local_dispatch_rows(ctx, ma, x);
    *rows = (ExpertRows){.rows_in = ma->rows_in, .row_probs = ma->row_probs, .rows_out = ma->rows_out,
                         .acts = &ma->experts,
                         .shape = {.groups = ctx->experts, .H = ctx->hidden, .I = ctx->moe_ffn, .in_store = ctx->rows_store,
                                   .d_out_store = ctx->rows_store,
                                   .counts = ma->plan.rows_per_expert,
                                   .host_counts = ma->plan.host_rows_per_expert, .rows = ma->plan.rows}};
}

static void local_combine(const MoeDispatchContext *ctx, MoeActs *ma, const ExpertRows *rows, real *out) {
    combine_forward(out, rows->rows_out, &ma->plan, ctx->hidden, 0);
}

// combine backward = dispatch of the output gradient (probs are inside the experts), its rows
// stored as the input rows are (only the down projection's GEMMs read them)
static void local_combine_backward(const MoeDispatchContext *ctx, MoeActs *ma, const MoeBackwardBuffers *grads,
                                   const real *d_out, ExpertRows *rows) {
    dispatch_forward(grads->d_rows_out, rows->shape.d_out_store, NULL, d_out, STORE_FP32, NULL, &ma->plan, ctx->hidden);
    expert_rows_set_backward(rows, grads->d_rows_out, grads->d_rows_in, grads->d_row_probs, grads->d_gate, grads->d_up,
                             grads->d_act);
}

// dispatch backward = combine of the input-row gradients (and gather of the prob gradients)
static void local_dispatch_backward(const MoeDispatchContext *ctx, MoeActs *ma, const MoeBackwardBuffers *grads,
                                    const ExpertRows *rows) {
    dispatch_backward(grads->d_x, grads->d_choice_probs, rows->d_rows_in, rows->d_row_probs, &ma->plan, ctx->hidden);
}

const TokenDispatcher TOKEN_DISPATCHER_LOCAL = {.name = "local", .dispatch = local_dispatch,
                                                .combine = local_combine, .combine_backward = local_combine_backward,
                                                .dispatch_backward = local_dispatch_backward};
