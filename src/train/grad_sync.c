#include "train/grad_sync.h"

#include <math.h>
#include <string.h>

void grad_sync_init(GradSync *g, const Comm *dp, const TensorTable *tt, int distributed, int parts) {
    memset(g, 0, sizeof(*g));
    g->dp = dp;
    g->distributed = distributed && dp->size > 1;
    g->overlap = !g->distributed && dp->size > 1;
    g->max_pending = parts;
    g->pending = g->overlap ? mt_calloc((size_t)parts, sizeof(CommRequest)) : NULL;
    int64_t total = (int64_t)tt->total, n = dp->size;
    g->counts = mt_malloc(n * sizeof(size_t));
    for (int64_t r = 0; r < n; r++) g->counts[r] = (size_t)(total * (r + 1) / n - total * r / n);
    g->begin = g->distributed ? total * dp->rank / n : 0;
    g->end = g->distributed ? total * (dp->rank + 1) / n : total;
    g->shard = g->distributed ? mt_malloc((size_t)MT_MAX(g->end - g->begin, 1) * sizeof(real)) : NULL;
}

void grad_sync_free(GradSync *g) {
    free(g->pending);
    free(g->counts);
    free(g->shard);
    memset(g, 0, sizeof(*g));
}

void grad_sync_reduce(GradSync *g, TensorTable *tt) {
    if (!g->distributed) {
        comm_allreduce_sum(g->dp, tt->grads, tt->total);
        return;
    }
    comm_reduce_scatter_v(g->dp, tt->grads, g->shard, g->counts);
    memcpy(tt->grads + g->begin, g->shard, (size_t)(g->end - g->begin) * sizeof(real));
}

void grad_sync_part_ready(GradSync *g, TensorTable *tt, int64_t begin, int64_t end) {
    MT_ASSERT(g->overlap && g->n_pending < g->max_pending);
    if (end > begin) comm_iallreduce_sum(g->dp, tt->grads + begin, (size_t)(end - begin), &g->pending[g->n_pending++]);
    for (int i = 0; i < g->n_pending; i++) comm_test(&g->pending[i]);  // let the earlier sums progress
}

void grad_sync_finish(GradSync *g) {
    for (int i = 0; i < g->n_pending; i++) comm_wait(&g->pending[i]);
    g->n_pending = 0;
}

double grad_sync_norm(const GradSync *g, const TensorTable *tt) {
    double sum = grad_sum_squares(tt, g->begin, g->end);
    if (g->distributed) comm_allreduce_sum_double(g->dp, &sum, 1);
    return sqrt(sum);
}

void grad_sync_gather_params(GradSync *g, TensorTable *tt) {
    if (!g->distributed) return;
    memcpy(g->shard, tt->params + g->begin, (size_t)(g->end - g->begin) * sizeof(real));
    comm_allgather_v(g->dp, g->shard, tt->params, g->counts);
}

void grad_sync_gather_moments(const GradSync *g, const Optimizer *shard, const TensorTable *tt, Optimizer *full) {
    MT_ASSERT(g->distributed);
    optimizer_init(full, tt);
    full->step = shard->step;
    comm_allgather_v(g->dp, shard->exp_avg, full->exp_avg, g->counts);
    comm_allgather_v(g->dp, shard->exp_avg_sq, full->exp_avg_sq, g->counts);
}

void grad_sync_take_moments(const GradSync *g, const Optimizer *full, Optimizer *shard) {
    size_t n = (size_t)(g->end - g->begin);
    memcpy(shard->exp_avg, full->exp_avg + g->begin, n * sizeof(real));
    memcpy(shard->exp_avg_sq, full->exp_avg_sq + g->begin, n * sizeof(real));
    shard->step = full->step;
}
