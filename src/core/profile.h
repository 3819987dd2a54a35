// profile.h — where a training step's time goes (`train --profile`).
//
// A function marks the work it does with PROF_SCOPE(kind) at its top: the wall time until
// it returns is charged to that kind, except the time spent in scopes opened inside it,
// which their own kinds get (a GEMM inside an attention projection counts as GEMM). Only
// the main thread, outside OpenMP parallel regions, records: the OpenMP workers run
// inside the scopes the main thread opened. Disabled (one branch per scope) until
// prof_enable(1).
#pragma once

typedef enum {
    PROF_GEMM,         // every mt_gemm: projections, experts, LM head
    PROF_ATTENTION,    // the attention core (QKᵀ, softmax, PV and their backward)
    PROF_NORM,         // RMSNorm
    PROF_ROPE,         // rotary embeddings
    PROF_ACTIVATION,   // SwiGLU, clamps, element-wise adds and copies
    PROF_ROUTER,       // router scores, top-k, losses and their backward
    PROF_DISPATCH,     // permute, combine (and their backward)
    PROF_EMBEDDING,    // token embedding
    PROF_LOSS,         // cross-entropy
    PROF_OPTIMIZER,    // clipping and AdamW
    PROF_GRAD_SYNC,    // gradient and parameter collectives (exposed part)
    PROF_EXPERT_COMM,  // expert-parallel token exchanges
    PROF_DATA,         // waiting for the next micro-batch
    PROF_KINDS
} ProfKind;

typedef struct {
    int kind;  // -1 when the scope records nothing
} ProfScope;

void prof_enable(int on);
int prof_enabled(void);
ProfScope prof_scope_begin(ProfKind kind);
void prof_scope_end(ProfScope *scope);
// Seconds charged to each kind since the last prof_reset.
void prof_seconds(double out[PROF_KINDS]);
void prof_reset(void);
const char *prof_kind_name(ProfKind kind);  // "gemm", "attention", ...
// One line per kind with time, largest first, as seconds and shares of total_s (the
// steps' wall time), then "other": what no scope claimed.
void prof_print(double total_s);

#if defined(__GNUC__)
#define PROF_SCOPE(kind) \
    ProfScope prof_scope_ __attribute__((cleanup(prof_scope_end), unused)) = prof_scope_begin(kind)
#else
#define PROF_SCOPE(kind) (void)0  // compilers without cleanup attributes: no profile
#endif
