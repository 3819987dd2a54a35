// arena.h — a bag of zeroed allocations freed together (activations, workspaces), in
// tensor memory (core/device.h).
#pragma once
#include "core/common.h"

typedef struct {
    void **blocks;
    int count, capacity;
    size_t bytes;  // total allocated, for memory reporting
} Arena;

void arena_init(Arena *a);
void *arena_alloc(Arena *a, size_t bytes);  // zeroed; lives until arena_free
real *arena_reals(Arena *a, size_t count);
int32_t *arena_ints(Arena *a, size_t count);
void arena_free(Arena *a);
