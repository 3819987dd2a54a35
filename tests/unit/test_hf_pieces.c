// test_hf_pieces.c — a tensor-parallel rank reads only its piece of each global tensor
// (src/hf/hf_weights.c): for every rank of TP x ETP layouts, a table cut by hand
// (tp_tables.h) loads a Hugging Face-style file with fused experts (gate_up_proj
// [E, 2I, H], down_proj [E, H, I]: ETP pieces of rows and of columns inside an expert's
// slice) and FP8 tensors with 128x128 block scales (a row piece of the embedding and a
// column piece of a dense down_proj that start inside a block), and every element equals
// the whole tensor one process loads.
#include <unistd.h>

#include "core/safetensors.h"
#include "hf/hf_weights.h"
#include "testlib.h"
#include "tiny_models.h"
#include "tp_tables.h"

enum { FP8_BLOCK = 128, FP8_NAN_BITS = 0x7f };

// A dense layer with a down_proj wider than a block, then a MoE layer; an untied head.
static void variant_wide_dense(Config *c) {
    strcpy(c->moe_layer_freq, "[0,1]");
    c->untie_embeddings_and_output_weights = 1;
    c->ffn_hidden_size = 2 * FP8_BLOCK;
}

typedef struct {
    uint8_t *bytes;
    float *scales;
} Fp8Tensor;

// d as F8_E4M3 bytes (any value but NaN) with a power-of-two scale per block.
static Fp8Tensor add_fp8(StWriter *w, const TensorDesc *d) {
    int64_t rows = d->shape[0], cols = d->shape[1];
    int64_t blocks[2] = {(rows + FP8_BLOCK - 1) / FP8_BLOCK, (cols + FP8_BLOCK - 1) / FP8_BLOCK};
    Fp8Tensor t = {mt_malloc((size_t)(rows * cols)), mt_malloc((size_t)(blocks[0] * blocks[1]) * sizeof(float))};
    for (int64_t i = 0; i < rows * cols; i++) {
        uint64_t h = mix64((uint64_t)i + 1);
        t.bytes[i] = (uint8_t)((h % FP8_NAN_BITS) | ((h >> 8) & 0x80));
    }
    for (int64_t b = 0; b < blocks[0] * blocks[1]; b++) t.scales[b] = (float)(1 << (b % 5)) / 4;
    char name[MT_NAME_MAX + 16];
    snprintf(name, sizeof(name), "%s_scale_inv", d->name);
    stw_add(w, d->name, ST_F8_E4M3, 2, d->shape, t.bytes);
    stw_add(w, name, ST_F32, 2, blocks, t.scales);
    return t;
}

// Layer `layer`'s experts fused as transformers v5 stores them.
static void add_fused_experts(StWriter *w, const Model *m, int layer, real **gate_up, real **down) {
    const LayerParams *lp = &m->layers[layer];
    const Config *c = &m->cfg;
    int64_t E = c->num_experts, I = c->moe_ffn, H = c->hidden_size;
    *gate_up = mt_malloc((size_t)(E * 2 * I * H) * sizeof(real));
    *down = mt_malloc((size_t)(E * H * I) * sizeof(real));
    for (int64_t e = 0; e < E; e++) {
        memcpy(*gate_up + e * 2 * I * H, tt_param(&m->tt, lp->expert_gate[e]), (size_t)(I * H) * sizeof(real));
        memcpy(*gate_up + (e * 2 + 1) * I * H, tt_param(&m->tt, lp->expert_up[e]), (size_t)(I * H) * sizeof(real));
        memcpy(*down + e * H * I, tt_param(&m->tt, lp->expert_down[e]), (size_t)(H * I) * sizeof(real));
    }
    char name[MT_NAME_MAX];
    snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.gate_up_proj", layer);
    stw_add(w, name, ST_F32, 3, (int64_t[]){E, 2 * I, H}, *gate_up);
    snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.down_proj", layer);
    stw_add(w, name, ST_F32, 3, (int64_t[]){E, H, I}, *down);
}

// DIR/model.safetensors from m's values: the embedding and the dense down_proj in FP8,
// the experts fused, everything else F32 under its own name.
static void write_hf_file(const char *dir, const Model *m) {
    StWriter w;
    stw_init(&w);
    TensorId fp8[2] = {m->embed, m->layers[0].mlp_down};
    Fp8Tensor stored[2];
    for (int k = 0; k < 2; k++) stored[k] = add_fp8(&w, &m->tt.descs[fp8[k]]);
    real *gate_up, *down;
    add_fused_experts(&w, m, 1, &gate_up, &down);
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        if (i == fp8[0] || i == fp8[1] || (d->flags & TENSOR_EXPERT)) continue;
        stw_add_real(&w, d->name, d->ndim, d->shape, tt_param(&m->tt, i));
    }
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CHECK(stw_finish(&w, path, err, sizeof(err)) == 0, "writing %s: %s", path, err);
    for (int k = 0; k < 2; k++) {
        free(stored[k].bytes);
        free(stored[k].scales);
    }
    free(gate_up);
    free(down);
}

static void test_rank_reads_its_piece(void) {
    Config c;
    tiny_moe_config(&c, 8, 1, 1, variant_wide_dense);
    char dir[] = "/tmp/moetron_test_hf_pieces_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    Model values, whole;
    model_build(&values, &c);
    for (int i = 0; i < values.tt.count; i++)
        for (size_t j = 0; j < values.tt.descs[i].numel; j++) tt_param(&values.tt, i)[j] = tp_value(i, (int64_t)j, 0);
    write_hf_file(dir, &values);
    model_build(&whole, &c);
    hf_weights_load(dir, &whole);  // the reference: whole tensors, FP8 scaled
    const TpCoords layouts[] = {{2, 0, 2, 0}, {4, 0, 1, 0}, {1, 0, 4, 0}, {4, 0, 2, 0}};
    int pieces_checked = 0;
    for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); l++) {
        TpCoords t = layouts[l];
        for (int rank = 0; rank < MT_MAX(t.tp, t.etp); rank++) {
            t.tp_rank = rank % t.tp, t.etp_rank = rank % t.etp;
            Model m;
            model_describe(&m, &c, NULL);
            tp_shard_table(&m.tt, &c, &t);
            hf_weights_load(dir, &m);
            for (int i = 0; i < m.tt.count; i++) {
                const TensorDesc *d = &m.tt.descs[i];
                const real *want = tt_param(&whole.tt, i), *got = tt_param(&m.tt, i);
                int64_t bad = -1;
                for (int64_t j = 0; j < (int64_t)d->numel && bad < 0; j++)
                    if (got[j] != want[tp_global_element(d, j)]) bad = j;
                CHECK(bad < 0, "TP %d rank %d, ETP %d rank %d: %s piece %d/%d element %lld: %g, expected %g", t.tp,
                      t.tp_rank, t.etp, t.etp_rank, d->name, d->shard.index, d->shard.parts, (long long)bad,
                      bad < 0 ? 0.0 : (double)got[bad], bad < 0 ? 0.0 : (double)want[tp_global_element(d, bad)]);
                pieces_checked += d->shard.parts > 1;
            }
            model_free(&m);
        }
    }
    CHECK(pieces_checked > 0, "no tensor was cut");
    model_free(&values);
    model_free(&whole);
    char path[512];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    RUN(test_rank_reads_its_piece);
    return tl_failed_cases ? 1 : 0;
}
