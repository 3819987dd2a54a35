// token_dispatcher.h — how the tokens of a MoE layer reach the experts and come back, as
// a table of phases (Megatron-Core's route -> dispatch -> experts -> combine): a
// dispatcher moves rows, it never calls the experts; moe_layer.c runs them between
// dispatch and combine on the ExpertRows the dispatcher hands over.
//
//   local      every expert here: permute (dispatch_forward), unpermute (combine_forward)
//   alltoall   expert parallelism: the permuted rows travel to the rank of their expert
//              and back (moe/expert_parallel.h)
//   allgather  expert parallelism by gathering every token of the group (and expert
//              tensor parallelism, whose FFN slices it sums)
#pragma once
#include "model/model.h"

typedef struct {
    const char *name;
    // x (N,H), ma->route -> rows (the rows this rank's experts compute)
    void (*dispatch)(const Model *m, MoeActs *ma, const real *x, ExpertRows *rows);
    // rows->rows_out -> out (N,H) overwritten
    void (*combine)(const Model *m, MoeActs *ma, const ExpertRows *rows, real *out);
    // d_out (N,H) -> rows->d_rows_out (and the gradient buffers of rows set)
    void (*combine_backward)(const Model *m, MoeActs *ma, ModelActs *a, const real *d_out, ExpertRows *rows);
    // rows->d_rows_in, rows->d_row_probs -> a->d_norm (N,H) overwritten, a->d_choice_probs (N,k)
    void (*dispatch_backward)(const Model *m, MoeActs *ma, ModelActs *a, const ExpertRows *rows);
} TokenDispatcher;

extern const TokenDispatcher TOKEN_DISPATCHER_LOCAL, TOKEN_DISPATCHER_ALLTOALL, TOKEN_DISPATCHER_ALLGATHER;

// The model's dispatcher: local on one rank, else --moe-token-dispatcher-type (allgather
// always with expert tensor parallelism).
const TokenDispatcher *token_dispatcher_of(const Model *m);

// The gradient buffers a dispatcher's combine_backward hands the experts: d_rows_out (the
// gradient of their outputs), d_rows_in and d_row_probs (where theirs go), three scratch
// buffers of (rows, I).
void expert_rows_set_backward(ExpertRows *rows, real *d_rows_out, real *d_rows_in, real *d_row_probs, real *gate,
                              real *up, real *act);

// The local dispatch of ma->route into ma's rows (the first step of the alltoall one too).
void local_dispatch_rows(const Model *m, MoeActs *ma, const real *x);
