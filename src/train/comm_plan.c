#include "train/comm_plan.h"

#include "train/grad_sync.h"

static const int REAL = sizeof(real), DOUBLE = sizeof(double);

const char *parallel_dim_name(ParallelDim d) {
    static const char *const names[DIMS] = {"tp", "cp", "dp", "ep", "pp"};
    return names[d];
}

// Elements this rank sends in an all-reduce of n over g (parallel/comm.h's count).
static double allreduce_elements(double n, const Comm *g) { return (double)comm_allreduce_elements_sent(g, (size_t)n); }

// Every layer of this rank's chunks (the multi-token-prediction depths' included): how many,
// how many MoE, how many with a shared expert, how many are MTP depths.
typedef struct {
    int layers, moe, shared, mtp;
} RankLayers;

static RankLayers rank_layers(const Model *m) {
    RankLayers r = {0, 0, 0, 0};
    const LayoutPlan *p = &m->plan;
    for (int l = 0; l < p->layers + p->mtp_layers; l++) {
        if (!plan_holds_layer(p, l)) continue;
        r.layers++;
        r.moe += m->layers[l].is_moe;
        r.shared += m->layers[l].is_moe && p->shared_ffn > 0;
        r.mtp += l >= p->layers;
    }
    return r;
}

// Tensor parallelism per step: block boundaries (with SP an all-gather and a reduce-scatter
// of the micro-batch's N x H activations each way, per attention, dense or shared-expert
// block and for the embedding and the head; without SP an all-reduce per block each way),
// the vocabulary-parallel loss (row maxima gathered, two statistics per token summed), the
// gradient norm, and with SP the replicated norms' (and latent MoE's projections') partial
// gradients. Each multi-token-prediction depth looks up the embedding and runs the head once
// more, and with SP adds its two norms, final norm and [H, 2H] projection to the partial
// gradients. With bf16 gathers (model_tp_gathers_bf16) each block's two all-gathers and each
// head's move half the bytes (not the embedding's backward one).
static double tp_bytes(const Config *c, const Model *m, int M, int N, int *estimated) {
    const LayoutPlan *p = &m->plan;
    int P = p->tp_size, H = p->hidden;
    if (P <= 1) return 0;
    RankLayers r = rank_layers(m);
    int heads = p->holds_head * (1 + r.mtp);
    int ends = p->holds_embedding + r.mtp + heads;  // the vocabulary-parallel ends this rank runs
    double X = (double)N * H, per_mb;
    int blocks = r.layers + (r.layers - r.moe) + r.shared;  // attention; the dense FFN or shared expert
    if (p->sequence_parallel)  // 4 collectives a block, 2 an end: (P-1)/P of X each
        per_mb = (4.0 * blocks + 2.0 * ends - (model_tp_gathers_bf16(m) ? (2.0 * blocks + heads) / 2 : 0)) * (P - 1) * X /
                 P * REAL;
    else  // 2 all-reduces a block, 1 an end
        per_mb = (2.0 * blocks + ends) * allreduce_elements(X, p->tp) * REAL;
    per_mb += heads * ((double)(P - 1) * N * REAL + allreduce_elements(2.0 * N, p->tp) * DOUBLE);
    double step = M * per_mb + allreduce_elements(1, p->tp) * DOUBLE;
    if (p->sequence_parallel)  // latent MoE's projections too (2·H·L a MoE layer)
        step += (r.layers * allreduce_elements(2.0 * H, p->tp) + (p->holds_head ? allreduce_elements(H, p->tp) : 0) +
                 r.moe * allreduce_elements(2.0 * H * c->moe_latent_size, p->tp) +
                 r.mtp * allreduce_elements(3.0 * H + 2.0 * H * H, p->tp)) * REAL;
    *estimated = r.moe > 0 || c->multi_latent_attention || c->qk_layernorm || p->kv_share.size > 1;
    return step;
}

// Context parallelism per layer and micro-batch, by the layer's --cp-comm-type, in blocks
// of the rank's N tokens: p2p (the ring) sends its keys and values CP - 1 hops forward and
// again backward, where their gradients go round the whole ring back to their owner:
// (3·CP - 2) key-value blocks; allgather gathers the keys and values forward and again
// backward and reduce-scatters their gradients: 3·(CP - 1); a2a sends (CP - 1)/CP of the
// queries, keys, values and output each way, forward, backward and for the gradients:
// 3·(CP - 1)/CP of q, k, v and out. (a2a+p2p: the inner all-to-all and the outer ring.)
// With bf16 exchanges (model_exchanges_bf16) the keys and values forward and backward, and
// the a2a's q, k, v, move half the bytes (their gradients and the outputs do not).
// Estimates: the log-sum-exps and loss sums besides are left out.
static double cp_layer_bytes(const LayoutPlan *p, CpCommType type, int inner, double N, int bf16) {
    int P = p->cp_size;
    double kv = N * (p->width.k + p->width.v) * REAL, qkv = N * (p->width.q + p->width.k + p->width.v) * REAL;
    double out = N * p->width.out * REAL, moved = bf16 ? 1.0 : 2.0;  // two trips of k, v (q, k, v) forward and backward
    double a2a = (moved + 1) * qkv + 3 * out;                          // and their gradients' one trip
    switch (type) {
    case CP_COMM_ALLGATHER: return (moved + 1) * (P - 1) * kv;
    case CP_COMM_A2A: return (double)(P - 1) / P * a2a;
    case CP_COMM_A2A_P2P: {
        int outer = P / inner;
        return (double)(inner - 1) / inner * a2a + (moved * (outer - 1) + outer) * kv * (outer > 1);
    }
    default: return (moved * (P - 1) + P) * kv;
    }
}

static double cp_bytes(const Config *c, const Model *m, int M, int N, int *estimated) {
    const LayoutPlan *p = &m->plan;
    if (p->cp_size <= 1) return 0;
    *estimated = 1;
    double bytes = 0;
    for (int l = 0; l < p->layers + p->mtp_layers; l++)  // the multi-token-prediction depths' too
        if (plan_holds_layer(p, l))
            bytes += cp_layer_bytes(p, p->cp_comm[l], p->cp_inner->size, (double)N, model_exchanges_bf16(m));
    return M * bytes;
}

// The data-parallel gradient reductions of each region over its group (with the distributed
// optimizer: the reduce-scatter of every other rank's blocks, and the parameter all-gather of
// this rank's shard), and the sharded gradient norm's sums.
static double dp_bytes(const Config *c, const Model *m, const GradGroups *gg, int *estimated) {
    const TensorTable *tt = &m->tt;
    FlatRange shards[REGIONS];
    double buffers;
    grad_sync_plan_shards(gg, tt, c->use_distributed_optimizer, shards, &buffers);
    const Comm *group[REGIONS] = {gg->dp, gg->edp};
    double n[REGIONS] = {(double)tt->dense_total, (double)(tt->total - tt->dense_total)}, bytes = 0;
    for (int r = 0; r < REGIONS; r++) {
        int P = group[r]->size;
        if (P <= 1 || n[r] == 0) continue;
        if (c->use_distributed_optimizer) {
            double mine = (double)(shards[r].end - shards[r].begin);
            bytes += (n[r] - mine + (P - 1) * mine) * REAL + allreduce_elements(1, group[r]) * DOUBLE;
        } else {
            bytes += allreduce_elements(n[r], group[r]) * REAL;  // over P > 2: each layer's bucket splits its own
        }
    }
    *estimated = 1;  // the step's loss and routing statistics, a few values
    return bytes;
}

// The token exchange per MoE layer and micro-batch: allgather (the group's inputs and
// routing gathered, the outputs reduce-scattered; backward the output gradient gathered and
// the input and prob gradients reduce-scattered), or alltoall under balanced routing (this
// rank's N·k rows, (EP-1)/EP of them to other ranks, there and back each way). With bf16
// rows (model_expert_rows_bf16) the rows and the output gradients going to the experts move
// half the bytes (allgather: when its exchange buffer holds them, ep_gather_packs_bf16; its
// tokens also when a MoE layer's ln2 is kept bf16, layout.h moe_norm_store).
static double ep_bytes(const Model *m, const Pipeline *pl, int M, int N, int *estimated) {
    const ExpertParallel *ep = &m->ep;
    if (!ep->gather) return 0;
    EpExchangeShape shape = acts_exchange_shape(m, pl->B, pl->T);
    const LayoutPlan *p = &m->plan;
    RankLayers r = rank_layers(m);
    int H = p->moe_hidden, k = p->topk, G = ep->gather->size;  // the rows' width: latent with latent MoE
    int bf16 = model_expert_rows_bf16(m);
    double per_layer;
    if (ep->dispatcher == DISPATCH_ALLGATHER) {
        // of (N, H): the tokens gathered (half when packed, or when a MoE layer's ln2 is kept bf16
        // and is what moves: not the latent rows), the output gradients gathered (half when
        // packed), the outputs and the input gradients reduce-scattered
        int packs = bf16 && ep_gather_packs_bf16(ep, &shape);
        int tokens_bf16 = packs || (p->moe_norm_store == STORE_BF16 && !m->cfg.moe_latent_size);
        double trips = (tokens_bf16 ? 0.5 : 1.0) + (packs ? 0.5 : 1.0) + 2.0;
        per_layer = (double)(G - 1) * (trips * N * H + 4.0 * N * k) * REAL;
    } else {
        *estimated = 1;
        double rows = (double)N * k * (ep->size - 1) / ep->size;
        per_layer = rows * ((bf16 ? 3.0 : 4.0) * H + 2) * REAL * (ep->etp ? ep->etp->size : 1);
    }
    double norm = (allreduce_elements(1, ep->comm) + (ep->etp ? allreduce_elements(1, ep->etp) : 0)) * DOUBLE;
    return M * r.moe * per_layer + norm;
}

// Pipeline stage boundaries: each chunk's output forward (but the last virtual stage's) and
// its input gradient backward (but the first's), per micro-batch; and the tied embedding's
// gradient summed between the first and the last stage.
static double pp_bytes(const Config *c, const Model *m, int M, int N_local) {
    const LayoutPlan *p = &m->plan;
    if (p->pp_size <= 1) return 0;
    int stages = p->pp_size * p->chunks;
    // the output as the residual stream is kept (layout.h), the gradient fp32
    double gradient = (double)N_local * p->hidden * REAL;
    double output = (double)N_local * p->hidden * storage_bytes(p->residual_store);
    double bytes = 0;
    for (int k = 0; k < p->chunks; k++) {
        int v = p->chunk[k].virtual_stage;
        bytes += M * ((v < stages - 1 ? output : 0) + (v > 0 ? gradient : 0));
    }
    int copies = !c->untie_embeddings_and_output_weights || c->mtp_num_layers;  // a tied head, MTP's table
    if (copies && (p->holds_embedding || p->holds_head)) {
        Comm ends = {.name = "embd", .rank = !p->holds_embedding, .size = 2};  // the first and the last stage
        bytes += allreduce_elements((double)p->vocab * p->hidden, &ends) * REAL;
    }
    return bytes;
}

CommPlan comm_plan(const Config *c, const Model *m, const Pipeline *pl, const GradGroups *gg) {
    CommPlan plan = {{0}, {0}};
    int M = pl->schedule.micro_batches, N = pl->B * pl->T, N_local = plan_local_tokens(&m->plan, N);
    plan.bytes[DIM_TP] = tp_bytes(c, m, M, N, &plan.estimated[DIM_TP]);
    plan.bytes[DIM_CP] = cp_bytes(c, m, M, N, &plan.estimated[DIM_CP]);
    plan.bytes[DIM_DP] = dp_bytes(c, m, gg, &plan.estimated[DIM_DP]);
    plan.bytes[DIM_EP] = ep_bytes(m, pl, M, N_local, &plan.estimated[DIM_EP]);
    plan.bytes[DIM_PP] = pp_bytes(c, m, M, N_local);
    return plan;
}
