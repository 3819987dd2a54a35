// buffer_plan.h — buffers described as specs (rows, cols, dtype, lifetime) and laid out in
// one allocation of tensor memory (core/device.h).
//
// A user declares every buffer first, each with the pointer that is to receive its
// address (its slot); buffer_plan_layout then gives each an offset — 64-byte aligned,
// grouped by lifetime, so that every lifetime is one contiguous region — and
// buffer_plan_allocate makes the one zeroed allocation and fills the slots. Sizes are
// known before anything is allocated (what a memory estimate needs), and the whole set
// is freed at once.
//
// An alias is a slot that receives another slot's address (a stage that is off reading
// its neighbour's buffer): it takes no memory, and is resolved after the buffers, in
// the order aliases were declared (an alias may name an earlier alias).
//
// Separate buffers: with MOETRON_BUFFERS=separate — the default of an AddressSanitizer build —
// buffer_plan_allocate gives every buffer an allocation of its own, of exactly its size, so
// that the sanitizer sees a kernel reading or writing past a buffer (inside the one block the
// next buffer would take it silently); the layout (offsets, regions, bytes) is the same and
// base stays NULL. MOETRON_BUFFERS=one keeps the one block.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/common.h"

// BUF_BF16: bf16 values in a real * slot (ops/gemm.h STORE_BF16: 2 bytes an element)
typedef enum { BUF_REAL, BUF_INT32, BUF_DOUBLE, BUF_BF16 } BufferDtype;

typedef enum {
    BUF_SAVED,      // written by the forward, read by the backward of the same micro-batch
    BUF_WORKSPACE,  // scratch of one operation or one backward: free again when it returns
    BUF_STAGE_IO,   // what enters or leaves the model as a whole: the batch, the last block's output, its gradient
    BUF_LIFETIMES
} BufferLifetime;

typedef struct {
    char name[64];
    size_t rows, cols;
    BufferDtype dtype;
    BufferLifetime lifetime;
    void *slot;     // the pointer variable (real *, int32_t *, double *) that receives the address
    size_t offset;  // bytes from the base, set by buffer_plan_layout
} BufferSpec;

typedef struct {
    void *slot, *source;  // *slot = *source once the buffers are placed
} BufferAlias;

typedef struct {
    BufferSpec *specs;
    int count, capacity;
    BufferAlias *aliases;
    int alias_count, alias_capacity;
    char scope[32];                       // prefix of the names declared next
    size_t bytes;                         // the whole allocation, after layout
    size_t region_offset[BUF_LIFETIMES];  // each lifetime's contiguous region, after layout
    size_t region_bytes[BUF_LIFETIMES];
    void *base;                           // the allocation, or NULL before buffer_plan_allocate
    void **separate;                      // (count) each buffer's own allocation, with separate buffers
} BufferPlan;

void buffer_plan_init(BufferPlan *bp);
// Names declared from now on start with this (printf-style; "" for none).
void buffer_plan_scope(BufferPlan *bp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// A rows × cols buffer whose address goes to *slot.
void buffer_real(BufferPlan *bp, real **slot, const char *name, size_t rows, size_t cols, BufferLifetime lifetime);
void buffer_bf16(BufferPlan *bp, real **slot, const char *name, size_t rows, size_t cols, BufferLifetime lifetime);
void buffer_int32(BufferPlan *bp, int32_t **slot, const char *name, size_t rows, size_t cols,
                  BufferLifetime lifetime);
void buffer_double(BufferPlan *bp, double **slot, const char *name, size_t rows, size_t cols,
                   BufferLifetime lifetime);
// *slot receives *source's address once it is known.
void buffer_alias(BufferPlan *bp, real **slot, real **source);

// Offsets and sizes; nothing is allocated.
void buffer_plan_layout(BufferPlan *bp);
// The one allocation (zeroed; or one per buffer, above), then every slot and alias. Lays out
// first if needed. Dies with one line when MOETRON_BUFFERS is neither one nor separate.
void buffer_plan_allocate(BufferPlan *bp);
// Whether buffer_plan_allocate makes one allocation per buffer (MOETRON_BUFFERS).
int buffer_plan_separate(void);
// The address of spec s of an allocated plan.
void *buffer_spec_address(const BufferPlan *bp, const BufferSpec *s);
void buffer_plan_free(BufferPlan *bp);

// The spec named name (scope included), or NULL.
const BufferSpec *buffer_plan_find(const BufferPlan *bp, const char *name);
size_t buffer_spec_bytes(const BufferSpec *s);
