// test_buffer_plan.c — core/buffer_plan.h (specs laid out in one allocation) and the
// activations' plan built on it (model/activations.c).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/buffer_plan.h"
#include "model/model.h"
#include "testlib.h"
#include "tiny_models.h"

static int overlaps(const BufferSpec *a, const BufferSpec *b) {
    size_t a_end = a->offset + buffer_spec_bytes(a), b_end = b->offset + buffer_spec_bytes(b);
    return a->offset < b_end && b->offset < a_end;
}

// Every buffer aligned, inside its lifetime's region, apart from every other; regions in
// lifetime order, back to back, covering the allocation.
static void check_layout(const BufferPlan *bp) {
    size_t at = 0;
    for (int life = 0; life < BUF_LIFETIMES; life++) {
        CHECK(bp->region_offset[life] == at, "region %d starts at %zu, not %zu", life, bp->region_offset[life], at);
        at += bp->region_bytes[life];
    }
    CHECK(at == bp->bytes, "regions cover %zu of %zu bytes", at, bp->bytes);
    for (int i = 0; i < bp->count; i++) {
        const BufferSpec *s = &bp->specs[i];
        size_t begin = bp->region_offset[s->lifetime], end = begin + bp->region_bytes[s->lifetime];
        CHECK(s->offset % 64 == 0, "%s at offset %zu", s->name, s->offset);
        CHECK(s->offset >= begin && s->offset + buffer_spec_bytes(s) <= end, "%s outside its region", s->name);
        for (int j = 0; j < i; j++)
            if (buffer_spec_bytes(s) && buffer_spec_bytes(&bp->specs[j]))
                CHECK(!overlaps(s, &bp->specs[j]), "%s overlaps %s", s->name, bp->specs[j].name);
    }
}

static void test_layout_and_slots(void) {
    setenv("MOETRON_BUFFERS", "one", 1);  // the one block (an AddressSanitizer build defaults to separate)
    BufferPlan bp;
    buffer_plan_init(&bp);
    real *saved = NULL, *work = NULL, *io = NULL, *empty = NULL, *alias = NULL, *alias_of_alias = NULL;
    int32_t *ids = NULL;
    double *counts = NULL;
    real *packed = NULL;
    buffer_real(&bp, &work, "work", 3, 5, BUF_WORKSPACE);
    buffer_plan_scope(&bp, "layer %d: ", 7);
    buffer_real(&bp, &saved, "saved", 10, 3, BUF_SAVED);
    buffer_int32(&bp, &ids, "ids", 4, 9, BUF_STAGE_IO);
    buffer_plan_scope(&bp, "%s", "");
    buffer_alias(&bp, &alias, &saved);
    buffer_alias(&bp, &alias_of_alias, &alias);
    buffer_real(&bp, &empty, "empty", 0, 8, BUF_SAVED);
    buffer_double(&bp, &counts, "counts", 5, 1, BUF_SAVED);
    buffer_real(&bp, &io, "io", 2, 2, BUF_STAGE_IO);
    buffer_bf16(&bp, &packed, "packed", 33, 2, BUF_WORKSPACE);  // 132 bytes
    buffer_plan_layout(&bp);
    CHECK(bp.base == NULL && saved == NULL, "layout allocates nothing");
    check_layout(&bp);
    CHECK(bp.region_bytes[BUF_SAVED] == 128 + 0 + 64, "saved region %zu bytes", bp.region_bytes[BUF_SAVED]);
    CHECK(bp.region_bytes[BUF_WORKSPACE] == 64 + 192, "workspace region %zu bytes", bp.region_bytes[BUF_WORKSPACE]);
    CHECK(bp.region_bytes[BUF_STAGE_IO] == 192 + 64, "stage IO region %zu bytes", bp.region_bytes[BUF_STAGE_IO]);
    const BufferSpec *s = buffer_plan_find(&bp, "layer 7: saved");
    CHECK(s && s->rows == 10 && s->cols == 3 && s->dtype == BUF_REAL, "scoped name and shape");
    CHECK(buffer_plan_find(&bp, "layer 7: io") == NULL && buffer_plan_find(&bp, "io"), "scope reset");
    size_t bytes = bp.bytes;
    buffer_plan_allocate(&bp);
    CHECK(bp.bytes == bytes, "allocation of %zu bytes, laid out as %zu", bp.bytes, bytes);
    char *base = bp.base;
    CHECK((char *)saved == base + s->offset, "slot receives its offset");
    CHECK((char *)work == base + bp.region_offset[BUF_WORKSPACE], "workspace region");
    CHECK((char *)ids == base + bp.region_offset[BUF_STAGE_IO], "first stage IO buffer");
    CHECK(alias == saved && alias_of_alias == saved, "aliases resolved in order");
    CHECK(empty != NULL && counts != NULL && io != NULL && packed != NULL, "every slot set");
    const BufferSpec *p = buffer_plan_find(&bp, "packed");
    CHECK(p && p->dtype == BUF_BF16 && buffer_spec_bytes(p) == 132, "bf16 spec: 2 bytes an element");
    int zero = 1;
    for (size_t i = 0; i < bp.bytes; i++) zero &= base[i] == 0;
    CHECK(zero, "memory zeroed");
    buffer_plan_free(&bp);
    CHECK(bp.base == NULL && bp.count == 0, "freed");
    unsetenv("MOETRON_BUFFERS");
}

// MOETRON_BUFFERS=separate: every buffer an allocation of its own (what the sanitizer build
// runs, so that it sees one buffer overrun into the next), zeroed, aliases resolved; a bad
// value is refused by name.
static void test_separate_buffers(void) {
    setenv("MOETRON_BUFFERS", "separate", 1);
    CHECK(buffer_plan_separate(), "separate asked");
    BufferPlan bp;
    buffer_plan_init(&bp);
    real *a = NULL, *b = NULL, *empty = NULL, *alias = NULL;
    buffer_real(&bp, &a, "a", 3, 5, BUF_SAVED);
    buffer_bf16(&bp, &b, "b", 3, 1, BUF_WORKSPACE);
    buffer_real(&bp, &empty, "empty", 0, 4, BUF_SAVED);
    buffer_alias(&bp, &alias, &b);
    buffer_plan_allocate(&bp);
    CHECK(bp.base == NULL && bp.separate != NULL, "no one block");
    CHECK(a && b && empty && a != b && alias == b, "every slot its own address, aliases resolved");
    CHECK(buffer_spec_address(&bp, buffer_plan_find(&bp, "a")) == a, "spec address");
    int zero = 1;
    for (int i = 0; i < 15; i++) zero &= a[i] == 0;
    for (int i = 0; i < 3; i++) zero &= ((uint16_t *)b)[i] == 0;
    CHECK(zero, "memory zeroed");
    CHECK(bp.bytes == 64 + 64, "laid out as the one block would be: %zu bytes", bp.bytes);
    buffer_plan_free(&bp);
    CHECK(bp.separate == NULL && bp.count == 0, "freed");
    setenv("MOETRON_BUFFERS", "one", 1);
    CHECK(!buffer_plan_separate(), "one asked");
    unsetenv("MOETRON_BUFFERS");
}

// A spec's buffer as the ModelActs field it was declared for.
static int field_in(const BufferPlan *bp, const char *name, const void *field, BufferLifetime lifetime) {
    const BufferSpec *s = buffer_plan_find(bp, name);
    return s && s->lifetime == lifetime && buffer_spec_address(bp, s) == field;
}

static void variant_shared_jitter(Config *c) {
    c->moe_shared_expert_intermediate_size = 16;
    c->moe_input_jitter_eps = 0.01;
}

// The activations of a model: one allocation, laid out as described (the estimate of the
// memory check is the allocation), each buffer where its lifetime says, stages that are
// off aliasing their neighbours.
static void test_model_activations(void) {
    Config c;
    tiny_moe_config(&c, 8, 0, 1, variant_shared_jitter);
    Model m;
    model_build(&m, &c);
    ModelActs described, a;
    acts_describe(&described, &m, 3, 8);
    CHECK(described.buffers.base == NULL && described.layers[0].ln1 == NULL, "describe allocates nothing");
    acts_alloc(&a, &m, 3, 8);
    CHECK(a.buffers.bytes == described.buffers.bytes, "estimate %zu bytes, allocation %zu", described.buffers.bytes,
          a.buffers.bytes);
    check_layout(&a.buffers);
    CHECK(field_in(&a.buffers, "layer 1: la->ln1", a.layers[1].ln1, BUF_SAVED), "ln1 saved");
    CHECK(field_in(&a.buffers, "layer 0: ma->jitter", a.layers[0].moe.jitter, BUF_SAVED), "jitter saved");
    CHECK(field_in(&a.buffers, "a->d_logits", a.d_logits, BUF_WORKSPACE), "d_logits a workspace");
    CHECK(field_in(&a.buffers, "a->input_ids", a.input_ids, BUF_STAGE_IO), "the batch staged");
    const BufferSpec *logits = buffer_plan_find(&a.buffers, "a->logits");
    CHECK(logits && logits->rows == 24 && logits->cols == (size_t)m.plan.vocab, "logits (N, vocab)");
    LayerActs *la = &a.layers[0];
    CHECK(la->q_raw == la->q && la->q_normed == la->q && la->ln1_full == la->ln1, "stages that are off alias");
    CHECK(la->ffn_partial == la->moe.shared_out && a.d_shared_in_full == a.d_shared_in, "no sequence parallelism");
    // what a layer's forward uses up before it returns (the experts' output rows, the shared
    // expert's output, the FFN's): one workspace each, every layer writing it in turn
    CHECK(field_in(&a.buffers, "a->moe_rows_out", a.moe_rows_out, BUF_WORKSPACE), "moe_rows_out a workspace");
    CHECK(field_in(&a.buffers, "a->ffn_out", a.ffn_out, BUF_WORKSPACE), "ffn_out a workspace");
    CHECK(field_in(&a.buffers, "a->shared_out", a.shared_out, BUF_WORKSPACE), "shared_out a workspace");
    for (int l = 0; l < 2; l++)
        CHECK(a.layers[l].moe.rows_out == a.moe_rows_out && a.layers[l].ffn_out == a.ffn_out &&
                  a.layers[l].moe.shared_out == a.shared_out,
              "layer %d's rows_out, ffn_out and shared_out are the workspaces", l);
    acts_free(&described);
    acts_free(&a);
    model_free(&m);
}

int main(void) {
    RUN(test_layout_and_slots);
    RUN(test_separate_buffers);
    RUN(test_model_activations);
    return tl_failed_cases != 0;
}
