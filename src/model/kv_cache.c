// kv_cache.c — per-layer key/value caches for generation (batch 1).
#include "core/device.h"
#include "model/layers.h"

// Keys are cached as attention sees them (after QK-norm and RoPE); with Multi-Latent
// Attention, expanded per head: [no-position part, shared rotary part].
KvCache *kv_caches_new(const Model *m) {
    const Config *c = &m->cfg;
    AttentionWidths w = m->plan.width;
    int k_width = w.k, v_width = w.v;
    KvCache *kv = mt_calloc(c->num_layers, sizeof(KvCache));
    for (int l = 0; l < c->num_layers; l++) {
        kv[l].capacity = c->max_positions;
        kv[l].k_width = k_width;
        kv[l].v_width = v_width;
        kv[l].k = device_calloc((size_t)c->max_positions * k_width, sizeof(real));
        kv[l].v = device_calloc((size_t)c->max_positions * v_width, sizeof(real));
    }
    return kv;
}

void kv_caches_free(KvCache *kv, const Model *m) {
    for (int l = 0; l < m->cfg.num_layers; l++) {
        device_free(kv[l].k);
        device_free(kv[l].v);
    }
    free(kv);
}
