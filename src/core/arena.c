#include "core/device.h"
#include "core/arena.h"

#include <string.h>

void arena_init(Arena *a) { memset(a, 0, sizeof(*a)); }

void *arena_alloc(Arena *a, size_t bytes) {
    if (a->count == a->capacity) {
        a->capacity = a->capacity ? 2 * a->capacity : 64;
        a->blocks = mt_realloc(a->blocks, a->capacity * sizeof(void *));
    }
    void *p = device_calloc(1, bytes);
    a->blocks[a->count++] = p;
    a->bytes += bytes;
    return p;
}

real *arena_reals(Arena *a, size_t count) { return arena_alloc(a, count * sizeof(real)); }
int32_t *arena_ints(Arena *a, size_t count) { return arena_alloc(a, count * sizeof(int32_t)); }

void arena_free(Arena *a) {
    for (int i = 0; i < a->count; i++) device_free(a->blocks[i]);
    free(a->blocks);
    memset(a, 0, sizeof(*a));
}
