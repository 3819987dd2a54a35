#include "train/pipeline.h"

#include <string.h>

#include "core/timer.h"
#include "model/stage_pass.h"

enum { TO_NEXT_STAGE, TO_PREVIOUS_STAGE };  // the two directions of a message

static int prev_rank(const Pipeline *pl) { return (pl->pp->rank - 1 + pl->pp->size) % pl->pp->size; }
static int next_rank(const Pipeline *pl) { return (pl->pp->rank + 1) % pl->pp->size; }

// The tag of the message about micro-batch mb for virtual stage `to`, going `direction`:
// distinct for every message a step has in flight.
static int message_tag(const Pipeline *pl, int micro_batch, int to, int direction) {
    int stages = pl->pp->size * pl->schedule.chunks;
    return (int)((((int64_t)micro_batch * stages + to) * 2 + direction) % COMM_MAX_TAG);
}

static size_t hidden_elements(const ModelActs *a, const Model *m) { return (size_t)a->N_local * m->plan.hidden; }
// The reals of the residual stream a stage passes on (x_final, x_entry), stored as the plan keeps it.
static size_t stream_reals(const ModelActs *a, const Model *m) {
    return storage_reals(hidden_elements(a, m), m->plan.residual_store);
}

void pipeline_init(Pipeline *pl, Model *m, const Comm *pp, int micro_batches, int group, int combined, int B,
                   int T) {
    memset(pl, 0, sizeof(*pl));
    pl->model = m;
    pl->pp = pp;
    pl->B = B, pl->T = T;
    char err[512];
    if (pp_schedule_make(&pl->schedule, pp->size, pp->rank, m->plan.chunks, micro_batches, group, combined, err,
                         sizeof(err)))
        mt_die("%s", err);
    int chunks = m->plan.chunks;
    pl->slots = mt_calloc((size_t)chunks, sizeof(int));
    for (int k = 0; k < chunks; k++) pl->slots[k] = MT_MAX(pl->schedule.in_flight[k], 1);
}

double pipeline_chunk_bytes(const Pipeline *pl, int k, double *exchange) {
    ModelActs described;
    acts_describe_chunk(&described, pl->model, k, pl->B, pl->T);
    double bytes = (double)described.buffers.bytes;
    *exchange = described.exchange_bytes;
    acts_free(&described);
    return bytes;
}

double pipeline_activation_bytes(const Pipeline *pl, double *exchange) {
    double bytes = 0;
    *exchange = model_exchange_scratch_bytes(pl->model, pl->B, pl->T);
    for (int k = 0; k < pl->schedule.chunks; k++) {
        double chunk_exchange, chunk = pipeline_chunk_bytes(pl, k, &chunk_exchange);
        bytes += chunk * pl->slots[k];
        *exchange += chunk_exchange * pl->slots[k];
    }
    return bytes;
}

void pipeline_allocate(Pipeline *pl) {
    int chunks = pl->schedule.chunks;
    pl->acts = mt_calloc((size_t)chunks, sizeof(ModelActs *));
    pl->sent_out = mt_calloc((size_t)chunks, sizeof(CommRequest *));
    pl->sent_grad = mt_calloc((size_t)chunks, sizeof(CommRequest *));
    for (int k = 0; k < chunks; k++) {
        pl->acts[k] = mt_calloc((size_t)pl->slots[k], sizeof(ModelActs));
        pl->sent_out[k] = mt_calloc((size_t)pl->slots[k], sizeof(CommRequest));
        pl->sent_grad[k] = mt_calloc((size_t)pl->slots[k], sizeof(CommRequest));
        for (int s = 0; s < pl->slots[k]; s++) acts_alloc_chunk(&pl->acts[k][s], pl->model, k, pl->B, pl->T);
    }
}

void pipeline_free(Pipeline *pl) {
    for (int k = 0; pl->acts && k < pl->schedule.chunks; k++) {
        for (int s = 0; s < pl->slots[k]; s++) {
            comm_wait(&pl->sent_out[k][s]);
            comm_wait(&pl->sent_grad[k][s]);
            acts_free(&pl->acts[k][s]);
        }
        free(pl->acts[k]);
        free(pl->sent_out[k]);
        free(pl->sent_grad[k]);
    }
    free(pl->acts);
    free(pl->sent_out);
    free(pl->sent_grad);
    free(pl->slots);
    pp_schedule_free(&pl->schedule);
    memset(pl, 0, sizeof(*pl));
}

// Waits for a transfer, counting the time as waiting on the neighbours.
static void wait_counted(Pipeline *pl, CommRequest *req) {
    if (!req->pending) return;
    double t0 = now_seconds();
    comm_wait(req);
    pl->waited_s += now_seconds() - t0;
}

// The previous stage's output for micro-batch mb, into a->x_entry.
static void receive_input(Pipeline *pl, ModelActs *a, const StageChunk *k, int mb) {
    CommRequest req;
    comm_irecv(pl->pp, a->x_entry, stream_reals(a, pl->model), prev_rank(pl),
               message_tag(pl, mb, k->virtual_stage, TO_NEXT_STAGE), &req);
    wait_counted(pl, &req);
}

// The shapes model_stage_forward sets, known before it runs (a receive needs them).
static void set_shape(ModelActs *a, const Model *m, const Batch *b) {
    a->B = b->B, a->T = b->T, a->N = b->B * b->T;
    a->N_local = plan_local_tokens(&m->plan, a->N);
}

// Before a forward: its slot free again, its batch, the previous stage's output.
static ModelActs *forward_prepare(Pipeline *pl, const PipelineStep *step, int chunk, int mb, const Batch **batch) {
    const StageChunk *k = &pl->model->plan.chunk[chunk];
    int slot = mb % pl->slots[chunk];
    ModelActs *a = &pl->acts[chunk][slot];
    wait_counted(pl, &pl->sent_out[chunk][slot]);  // x_final is this slot's again
    *batch = step->batch(step->ctx, mb);
    set_shape(a, pl->model, *batch);
    if (!k->holds_embedding) receive_input(pl, a, k, mb);
    return a;
}

// After a forward: its output on its way to the next stage, its losses counted.
static void forward_finish(Pipeline *pl, const PipelineStep *step, int chunk, int mb, ModelActs *a) {
    const StageChunk *k = &pl->model->plan.chunk[chunk];
    if (!k->holds_head)
        comm_isend(pl->pp, a->x_final, stream_reals(a, pl->model), next_rank(pl),
                   message_tag(pl, mb, k->virtual_stage + 1, TO_NEXT_STAGE), &pl->sent_out[chunk][mb % pl->slots[chunk]]);
    if (step->forward_done) step->forward_done(step->ctx, a, mb);
}

// Before a backward: its slot's gradient buffer free again, the next stage's gradient.
static ModelActs *backward_prepare(Pipeline *pl, int chunk, int mb) {
    const StageChunk *k = &pl->model->plan.chunk[chunk];
    int slot = mb % pl->slots[chunk];
    ModelActs *a = &pl->acts[chunk][slot];
    wait_counted(pl, &pl->sent_grad[chunk][slot]);  // d_resid is this slot's again
    if (!k->holds_head) {
        CommRequest req;
        comm_irecv(pl->pp, a->d_resid, hidden_elements(a, pl->model), next_rank(pl),
                   message_tag(pl, mb, k->virtual_stage, TO_PREVIOUS_STAGE), &req);
        wait_counted(pl, &req);
    }
    return a;
}

// After a backward: the input's gradient on its way to the previous stage.
static void backward_finish(Pipeline *pl, int chunk, int mb, ModelActs *a) {
    const StageChunk *k = &pl->model->plan.chunk[chunk];
    if (!k->holds_embedding)
        comm_isend(pl->pp, a->d_resid, hidden_elements(a, pl->model), prev_rank(pl),
                   message_tag(pl, mb, k->virtual_stage - 1, TO_PREVIOUS_STAGE),
                   &pl->sent_grad[chunk][mb % pl->slots[chunk]]);
}

// The backward's pass; during each chunk's last backward its gradients become final.
static void backward_pass(Pipeline *pl, const PipelineStep *step, StagePass *pass, int chunk, int mb, ModelActs *a) {
    int last = mb == pl->schedule.micro_batches - 1;
    stage_pass_backward(pass, pl->model, a, step->loss_scale, last ? step->grads_ready : NULL, step->ctx);
}

static void run_forward(Pipeline *pl, const PipelineStep *step, const PpStep *st) {
    const Batch *batch;
    ModelActs *a = forward_prepare(pl, step, st->chunk, st->micro_batch, &batch);
    model_stage_forward(pl->model, a, batch, NULL, 0);
    forward_finish(pl, step, st->chunk, st->micro_batch, a);
}

static void run_backward(Pipeline *pl, const PipelineStep *step, const PpStep *st) {
    ModelActs *a = backward_prepare(pl, st->chunk, st->micro_batch);
    StagePass pass;
    backward_pass(pl, step, &pass, st->chunk, st->micro_batch, a);
    while (stage_pass_advance(&pass)) continue;
    backward_finish(pl, st->chunk, st->micro_batch, a);
}

// A forward and a backward together: their steps alternate, so that each one's token
// exchanges travel while the other computes.
static void run_combined(Pipeline *pl, const PipelineStep *step, const PpStep *fs, const PpStep *bs) {
    const Batch *batch;
    ModelActs *fa = forward_prepare(pl, step, fs->chunk, fs->micro_batch, &batch);
    ModelActs *ba = backward_prepare(pl, bs->chunk, bs->micro_batch);
    // two micro-batches' slots: the workspaces a layer's forward and its backward both use (the
    // attention's d_q, d_k, d_v and the experts' rows: model/activations.c) are then apart
    MT_ASSERT(fa != ba);
    StagePass forward, backward;
    stage_pass_forward(&forward, pl->model, fa, batch, NULL, 0);
    backward_pass(pl, step, &backward, bs->chunk, bs->micro_batch, ba);
    for (int more = 1; more;) {
        more = stage_pass_advance(&forward);
        more |= stage_pass_advance(&backward);
    }
    forward_finish(pl, step, fs->chunk, fs->micro_batch, fa);
    backward_finish(pl, bs->chunk, bs->micro_batch, ba);
}

static void wait_all_sends(Pipeline *pl) {
    for (int k = 0; k < pl->schedule.chunks; k++)
        for (int s = 0; s < pl->slots[k]; s++) {
            wait_counted(pl, &pl->sent_out[k][s]);
            wait_counted(pl, &pl->sent_grad[k][s]);
        }
}

void pipeline_run(Pipeline *pl, const PipelineStep *step) {
    double t0 = now_seconds();
    pl->waited_s = 0;
    const PpSchedule *s = &pl->schedule;
    for (int i = 0; i < s->n; i++) {
        const PpStep *st = &s->steps[i];
        if (pp_schedule_pair_at(s, i)) run_combined(pl, step, st, &s->steps[++i]);
        else if (st->kind == PP_FORWARD) run_forward(pl, step, st);
        else run_backward(pl, step, st);
    }
    wait_all_sends(pl);
    pl->step_s = now_seconds() - t0;
}

double pipeline_forward_only(Pipeline *pl, const Batch *batch) {
    double loss = 0;
    for (int chunk = 0; chunk < pl->schedule.chunks; chunk++) {
        const StageChunk *k = &pl->model->plan.chunk[chunk];
        ModelActs *a = &pl->acts[chunk][0];
        wait_counted(pl, &pl->sent_out[chunk][0]);
        set_shape(a, pl->model, batch);
        if (!k->holds_embedding) receive_input(pl, a, k, 0);
        model_stage_forward(pl->model, a, batch, NULL, 0);
        if (k->holds_head) loss = a->lm_loss;
        else
            comm_isend(pl->pp, a->x_final, stream_reals(a, pl->model), next_rank(pl),
                       message_tag(pl, 0, k->virtual_stage + 1, TO_NEXT_STAGE), &pl->sent_out[chunk][0]);
    }
    wait_all_sends(pl);
    return loss;
}
