#include "core/buffer_plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"

enum { BUFFER_ALIGN = 64 };  // bytes: a cache line, an AVX-512 vector, a GPU's coalesced access

static const size_t DTYPE_BYTES[] = {[BUF_REAL] = sizeof(real), [BUF_INT32] = sizeof(int32_t),
                                     [BUF_DOUBLE] = sizeof(double), [BUF_BF16] = sizeof(uint16_t)};

void buffer_plan_init(BufferPlan *bp) { memset(bp, 0, sizeof(*bp)); }

void buffer_plan_scope(BufferPlan *bp, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(bp->scope, sizeof(bp->scope), fmt, ap);
    va_end(ap);
}

static int allocated(const BufferPlan *bp) { return bp->base || bp->separate; }

static void add_spec(BufferPlan *bp, void *slot, const char *name, size_t rows, size_t cols, BufferDtype dtype,
                     BufferLifetime lifetime) {
    MT_ASSERT(!allocated(bp));  // declared before the allocation
    if (bp->count == bp->capacity) {
        bp->capacity = bp->capacity ? 2 * bp->capacity : 128;
        bp->specs = mt_realloc(bp->specs, bp->capacity * sizeof(BufferSpec));
    }
    BufferSpec *s = &bp->specs[bp->count++];
    *s = (BufferSpec){.rows = rows, .cols = cols, .dtype = dtype, .lifetime = lifetime, .slot = slot};
    snprintf(s->name, sizeof(s->name), "%s%s", bp->scope, name);
    bp->bytes = 0;  // laid out again
}

void buffer_real(BufferPlan *bp, real **slot, const char *name, size_t rows, size_t cols, BufferLifetime lifetime) {
    add_spec(bp, slot, name, rows, cols, BUF_REAL, lifetime);
}

void buffer_bf16(BufferPlan *bp, real **slot, const char *name, size_t rows, size_t cols, BufferLifetime lifetime) {
    add_spec(bp, slot, name, rows, cols, BUF_BF16, lifetime);
}

void buffer_int32(BufferPlan *bp, int32_t **slot, const char *name, size_t rows, size_t cols,
                  BufferLifetime lifetime) {
    add_spec(bp, slot, name, rows, cols, BUF_INT32, lifetime);
}

void buffer_double(BufferPlan *bp, double **slot, const char *name, size_t rows, size_t cols,
                   BufferLifetime lifetime) {
    add_spec(bp, slot, name, rows, cols, BUF_DOUBLE, lifetime);
}

void buffer_alias(BufferPlan *bp, real **slot, real **source) {
    MT_ASSERT(!allocated(bp));
    if (bp->alias_count == bp->alias_capacity) {
        bp->alias_capacity = bp->alias_capacity ? 2 * bp->alias_capacity : 64;
        bp->aliases = mt_realloc(bp->aliases, bp->alias_capacity * sizeof(BufferAlias));
    }
    bp->aliases[bp->alias_count++] = (BufferAlias){slot, source};
}

size_t buffer_spec_bytes(const BufferSpec *s) {
    MT_ASSERT(s->cols == 0 || s->rows <= SIZE_MAX / s->cols / DTYPE_BYTES[s->dtype]);
    return s->rows * s->cols * DTYPE_BYTES[s->dtype];
}

static size_t aligned(size_t bytes) { return (bytes + BUFFER_ALIGN - 1) / BUFFER_ALIGN * BUFFER_ALIGN; }

// Regions in lifetime order; inside one, the buffers in the order they were declared.
void buffer_plan_layout(BufferPlan *bp) {
    size_t at = 0;
    for (int life = 0; life < BUF_LIFETIMES; life++) {
        bp->region_offset[life] = at;
        for (int i = 0; i < bp->count; i++) {
            BufferSpec *s = &bp->specs[i];
            if (s->lifetime != life) continue;
            s->offset = at;
            at += aligned(buffer_spec_bytes(s));
        }
        bp->region_bytes[life] = at - bp->region_offset[life];
    }
    bp->bytes = at;
}

static void set_slot(void *slot, void *address) { memcpy(slot, &address, sizeof(address)); }

int buffer_plan_separate(void) {
    const char *asked = getenv("MOETRON_BUFFERS");
    if (!asked || !asked[0]) {
#if defined(__SANITIZE_ADDRESS__)
        return 1;
#else
        return 0;
#endif
    }
    if (!strcmp(asked, "one")) return 0;
    if (!strcmp(asked, "separate")) return 1;
    mt_die("MOETRON_BUFFERS=%s: use one or separate (or unset it)", asked);
}

void *buffer_spec_address(const BufferPlan *bp, const BufferSpec *s) {
    MT_ASSERT(allocated(bp));
    return bp->separate ? bp->separate[s - bp->specs] : (char *)bp->base + s->offset;
}

void buffer_plan_allocate(BufferPlan *bp) {
    MT_ASSERT(!allocated(bp));
    buffer_plan_layout(bp);
    if (buffer_plan_separate()) {
        bp->separate = mt_calloc((size_t)MT_MAX(bp->count, 1), sizeof(void *));
        for (int i = 0; i < bp->count; i++) bp->separate[i] = device_calloc(1, buffer_spec_bytes(&bp->specs[i]));
    } else {
        bp->base = device_calloc(1, bp->bytes);
    }
    for (int i = 0; i < bp->count; i++) set_slot(bp->specs[i].slot, buffer_spec_address(bp, &bp->specs[i]));
    for (int i = 0; i < bp->alias_count; i++) *(real **)bp->aliases[i].slot = *(real **)bp->aliases[i].source;
}

void buffer_plan_free(BufferPlan *bp) {
    if (bp->base) device_free(bp->base);
    for (int i = 0; bp->separate && i < bp->count; i++) device_free(bp->separate[i]);
    free(bp->separate);
    free(bp->specs);
    free(bp->aliases);
    memset(bp, 0, sizeof(*bp));
}

const BufferSpec *buffer_plan_find(const BufferPlan *bp, const char *name) {
    for (int i = 0; i < bp->count; i++)
        if (!strcmp(bp->specs[i].name, name)) return &bp->specs[i];
    return NULL;
}
