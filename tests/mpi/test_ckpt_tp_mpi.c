// test_ckpt_tp_mpi.c — checkpoints of tensor-parallel runs stay global (src/train/ckpt_shards.c,
// src/hf/hf_weights.c), run by tests/cli/test_mpi_tp_checkpoint.sh under mpirun -np 2 and 4.
//
//   test_ckpt_tp_mpi DIR   a small MoE model (one dense layer, one MoE layer, untied head,
//                          grouped kv heads, QK-norm) described with its layout plan (and, for
//                          some layouts, cut by hand by tests/unit/tp_tables.h) for a chain of
//                          layouts (TP, ETP, EP, DP, the
//                          distributed optimizer): pieces of rows (embedding, q/k/v, gate/up,
//                          lm_head), of columns (o_proj, down), kv pieces fewer than TP,
//                          replicated norms and routers, experts cut over ETP on their EP rank.
//                          Each layout loads the previous one's checkpoint and checks every
//                          parameter and moment it holds bit for bit, then saves its own; every
//                          save's model.safetensors and optimizer.safetensors are byte for
//                          byte those one process writes, and one process loads the last.
//
// Every value is a function of (tensor, global element, buffer), so each rank knows what
// each element it holds must be. Rank 0 prints "ok <check>_np<P>" when no rank failed; a
// failing rank prints "FAIL <check>_np<P>: [rank r] ...".
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/fileio.h"
#include "parallel/groups.h"
#include "train/ckpt_shards.h"
#include "../unit/tiny_models.h"
#include "../unit/tp_tables.h"

#include "mpi_check.h"

// ---- one layout ---------------------------------------------------------------------------------

typedef struct {
    const char *name;
    int tp, ep, etp, distributed;
    int hand_cut;  // the table cut by tp_tables.h instead of the model's own layout plan
} Layout;

typedef struct {
    Config cfg;
    ParallelGroups pg;
    Model m;
    GradSync sync;
    Optimizer opt;
} Run;

static void run_open(Run *r, const Config *base, const Layout *l) {
    memset(r, 0, sizeof(*r));
    r->cfg = *base;
    r->cfg.tensor_model_parallel_size = l->tp;
    r->cfg.expert_model_parallel_size = l->ep;
    r->cfg.expert_tensor_parallel_size = l->etp;
    r->cfg.use_distributed_optimizer = l->distributed;
    parallel_groups_init(&r->pg, &r->cfg);
    const Comm *pg = r->pg.comm;
    ModelGroups groups = {.tp = &pg[PG_TP], .ep = &pg[PG_EP], .etp = &pg[PG_ETP], .etp_ep = &pg[PG_ETP_EP],
                          .count = &pg[PG_DP_CP]};
    model_describe(&r->m, &r->cfg, &groups);  // the model's own pieces of each tensor
    if (l->hand_cut) {
        TpCoords coords = {pg[PG_TP].size, pg[PG_TP].rank, pg[PG_ETP].size, pg[PG_ETP].rank};
        tp_shard_table(&r->m.tt, &r->cfg, &coords);
    } else {
        tt_allocate(&r->m.tt);
    }
    GradGroups grad_groups = {.dp = &pg[PG_DP_CP], .edp = &pg[PG_EDP], .ep = &pg[PG_EP], .tp = &pg[PG_TP],
                              .etp = &pg[PG_ETP]};
    grad_sync_init(&r->sync, &grad_groups, &r->m.tt, l->distributed, 1);
    FlatRange ranges[REGIONS];
    int n = grad_sync_shards(&r->sync, ranges);
    optimizer_init_ranges(&r->opt, &r->m.tt, ranges, n, NULL);
}

static void run_close(Run *r) {
    optimizer_free(&r->opt);
    grad_sync_free(&r->sync);
    model_free(&r->m);
    parallel_groups_free(&r->pg);
}

// Fill (fill = 1) or check every parameter and moment this rank holds against tp_value().
static void visit(const Model *m, Optimizer *opt, int fill) {
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        for (int64_t j = 0; j < (int64_t)d->numel; j++) {
            int64_t e = tp_global_element(d, j), flat = (int64_t)d->offset + j;
            real *p = &m->tt.params[flat];
            if (fill) *p = tp_value(d->global_index, e, CKPT_PARAMS);
            expect(*p == tp_value(d->global_index, e, CKPT_PARAMS), "%s element %lld: parameter %.9g, expected %.9g",
                   d->name, (long long)e, (double)*p, (double)tp_value(d->global_index, e, CKPT_PARAMS));
            for (int r = 0; r < opt->n_ranges; r++) {
                if (flat < opt->ranges[r].begin || flat >= opt->ranges[r].end) continue;
                size_t at = optimizer_moment_base(opt, r) + (size_t)(flat - opt->ranges[r].begin);
                real *moment[2] = {(real *)opt->moment[0] + at, (real *)opt->moment[1] + at};
                for (int k = 0; k < 2; k++) {
                    real want = tp_value(d->global_index, e, CKPT_EXP_AVG + k);
                    if (fill) *moment[k] = want;
                    expect(*moment[k] == want, "%s element %lld: moment %d %.9g, expected %.9g", d->name,
                           (long long)e, k, (double)*moment[k], (double)want);
                }
            }
        }
    }
}

enum { SAVED_ITERATION = 3, SAVED_STEP = 5, SAVED_SAMPLES = 12 };

static void save_run(Run *r, const char *dir) {
    CkptShards shards;
    ckpt_shards_open(&shards, &r->m, &r->opt, &r->sync);
    CkptSource src = ckpt_shards_source(&shards);
    TrainerState st = {.iteration = SAVED_ITERATION, .consumed_train_samples = SAVED_SAMPLES};
    checkpoint_save_from(dir, &shards.global, &src, &st);
    ckpt_shards_close(&shards);
    comm_barrier(&world);  // rank 0 has published it
}

static void load_and_check(Model *m, Optimizer *opt, const char *dir) {
    char resolved[MT_PATH_MAX + 32];
    checkpoint_resolve(resolved, dir);
    TrainerState st = {0};
    opt->step = 0;
    checkpoint_load(resolved, m, opt, &st);
    expect(st.iteration == SAVED_ITERATION && st.consumed_train_samples == SAVED_SAMPLES && opt->step == SAVED_STEP,
           "trainer state %ld/%lld/%ld after loading %s", st.iteration, (long long)st.consumed_train_samples,
           opt->step, dir);
    visit(m, opt, 0);
}

// ---- the files -----------------------------------------------------------------------------------

static char *iteration_file(const char *dir, const char *file) {
    static char path[MT_PATH_MAX + 128];
    snprintf(path, sizeof(path), "%s/iter_%07d/%s", dir, SAVED_ITERATION, file);
    return path;
}

static int same_file(const char *a, const char *b) {
    char err[256];
    size_t na, nb;
    unsigned char *x = read_file_all(a, INFILE_WEIGHTS, &na, err, sizeof(err));
    unsigned char *y = x ? read_file_all(b, INFILE_WEIGHTS, &nb, err, sizeof(err)) : NULL;
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

// Rank 0: the layout's files are those one process wrote into reference.
static void expect_files_as_one_process(const char *dir, const char *reference) {
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int f = 0; world.rank == 0 && f < 2; f++) {
        char want[MT_PATH_MAX + 128];
        snprintf(want, sizeof(want), "%s", iteration_file(reference, files[f]));
        expect(same_file(iteration_file(dir, files[f]), want), "%s differs from the one-process %s",
               iteration_file(dir, files[f]), want);
    }
}

// A dense layer before the MoE layer, and an LM head of its own.
static void variant_dense_and_head(Config *c) {
    strcpy(c->moe_layer_freq, "[0,1]");
    c->untie_embeddings_and_output_weights = 1;
}

static void base_config(Config *c) { tiny_moe_config(c, 8, 1, 1, variant_dense_and_head); }

// One process writes the reference checkpoint (rank 0, world ranks waiting).
static void save_one_process(const Config *c, const char *dir) {
    if (world.rank == 0) {
        Model m;
        model_build(&m, c);
        Optimizer opt;
        optimizer_init(&opt, &m.tt);
        visit(&m, &opt, 1);
        opt.step = SAVED_STEP;
        TrainerState st = {.iteration = SAVED_ITERATION, .consumed_train_samples = SAVED_SAMPLES};
        checkpoint_save(dir, &m, &opt, &st);
        optimizer_free(&opt);
        model_free(&m);
    }
    comm_barrier(&world);
}

static void load_one_process(const Config *c, const char *dir) {
    if (world.rank != 0) return;
    Model m;
    model_build(&m, c);
    Optimizer opt;
    optimizer_init(&opt, &m.tt);
    load_and_check(&m, &opt, dir);
    optimizer_free(&opt);
    model_free(&m);
}

// The chain: one process -> each layout in turn -> one process.
static int check_layout_chain(const char *root, const Layout *layouts, int n) {
    int ok = 1;
    Config base;
    base_config(&base);
    char reference[MT_PATH_MAX], from[MT_PATH_MAX], to[MT_PATH_MAX];
    snprintf(reference, sizeof(reference), "%s/one_process", root);
    save_one_process(&base, reference);
    snprintf(from, sizeof(from), "%s", reference);
    for (int k = 0; k < n; k++) {
        begin(layouts[k].name);
        Run r;
        run_open(&r, &base, &layouts[k]);
        load_and_check(&r.m, &r.opt, from);
        snprintf(to, sizeof(to), "%s/%s", root, layouts[k].name);
        save_run(&r, to);
        expect_files_as_one_process(to, reference);
        run_close(&r);
        ok &= end();
        snprintf(from, sizeof(from), "%s", to);
    }
    begin("tp_checkpoint_one_process_resumes_the_last");
    load_one_process(&base, from);
    return end() && ok;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    comm_world_init(&argc, &argv);
    world = comm_world();
    if (argc != 2) mt_die("usage: test_ckpt_tp_mpi DIR (a directory every rank can write)");
    static const Layout four[] = {
        {"tp_checkpoint_tp2_etp2_ep2_distributed", 2, 2, 2, 1, 0},  // dense dp 2 sharded, experts cut
        {"tp_checkpoint_tp4_ep2_edp2_distributed", 4, 2, 1, 1, 0},  // kv pieces on 2 ranks each
        {"tp_checkpoint_tp1_ep4_dp4_distributed", 1, 4, 1, 1, 0},   // data and expert parallel only
        {"tp_checkpoint_tp2_etp2_edp2", 2, 1, 2, 0, 0},             // experts cut, replicated over edp
        {"tp_checkpoint_hand_cut_tp4_ep2_distributed", 4, 2, 1, 1, 1},
        {"tp_checkpoint_hand_cut_tp2_etp2_ep2", 2, 2, 2, 0, 1},
    };
    static const Layout two[] = {
        {"tp_checkpoint_tp2_edp2_distributed", 2, 1, 1, 1, 0},
        {"tp_checkpoint_tp2_etp2", 2, 1, 2, 0, 0},
        {"tp_checkpoint_tp1_ep2_distributed", 1, 2, 1, 1, 0},
        {"tp_checkpoint_hand_cut_tp2_etp2_distributed", 2, 1, 2, 1, 1},
    };
    if (world.size != 2 && world.size != 4) mt_die("run under mpirun -np 2 or 4 (this world has %d)", world.size);
    int ok = world.size == 4 ? check_layout_chain(argv[1], four, 6) : check_layout_chain(argv[1], two, 4);
    comm_world_finalize();
    return ok ? 0 : 1;
}
