// strmap.h — a hash map from byte strings (any bytes, explicit length) to int32 values:
// open addressing with linear probing over a power-of-two slot array; the keys are copied
// into one pool. Used for the tokenizer vocabulary (token string -> id).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    size_t offset;   // key position in pool
    uint32_t length;
    int32_t value;
} StrMapEntry;

typedef struct {
    char *pool;
    size_t pool_len, pool_cap;
    StrMapEntry *entries;  // in insertion order
    size_t count, entries_cap;
    int32_t *slots;        // entry index, or -1 when empty
    size_t slot_count;     // power of two, > 2 * count
} StrMap;

void strmap_init(StrMap *m);
void strmap_free(StrMap *m);
// Inserts key -> value. Returns 1 when inserted, 0 when the key was already there (its
// value is left unchanged).
int strmap_put(StrMap *m, const char *key, size_t len, int32_t value);
// The value of key, or -1 when absent.
int32_t strmap_get(const StrMap *m, const char *key, size_t len);
// The key of entry i (0 <= i < count); *len its length.
const char *strmap_key(const StrMap *m, size_t i, size_t *len);
