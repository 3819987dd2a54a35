// strmap.c — byte-string -> int32 hash map (see strmap.h).
#include "tokenizer/strmap.h"

#include <string.h>

#include "core/common.h"

static uint64_t hash_bytes(const char *s, size_t len) {  // FNV-1a, 64-bit
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

void strmap_init(StrMap *m) { memset(m, 0, sizeof *m); }

void strmap_free(StrMap *m) {
    free(m->pool);
    free(m->entries);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static int key_equals(const StrMap *m, const StrMapEntry *e, const char *key, size_t len) {
    return e->length == len && memcmp(m->pool + e->offset, key, len) == 0;
}

// The slot holding key, or the empty slot where it would go.
static size_t find_slot(const StrMap *m, const char *key, size_t len) {
    size_t mask = m->slot_count - 1, i = (size_t)hash_bytes(key, len) & mask;
    while (m->slots[i] >= 0 && !key_equals(m, &m->entries[m->slots[i]], key, len)) i = (i + 1) & mask;
    return i;
}

static void rehash(StrMap *m, size_t slot_count) {
    free(m->slots);
    m->slot_count = slot_count;
    m->slots = mt_malloc(slot_count * sizeof(int32_t));
    memset(m->slots, 0xff, slot_count * sizeof(int32_t));  // all -1
    for (size_t e = 0; e < m->count; e++) {
        const StrMapEntry *entry = &m->entries[e];
        m->slots[find_slot(m, m->pool + entry->offset, entry->length)] = (int32_t)e;
    }
}

int strmap_put(StrMap *m, const char *key, size_t len, int32_t value) {
    if (2 * (m->count + 1) >= m->slot_count) rehash(m, m->slot_count ? 2 * m->slot_count : 64);
    size_t slot = find_slot(m, key, len);
    if (m->slots[slot] >= 0) return 0;
    if (m->count >= INT32_MAX / 2) mt_die("internal error: string map too large");
    if (m->count == m->entries_cap) {
        m->entries_cap = m->entries_cap ? 2 * m->entries_cap : 64;
        m->entries = mt_realloc(m->entries, m->entries_cap * sizeof(StrMapEntry));
    }
    if (m->pool_len + len + 1 > m->pool_cap) {
        m->pool_cap = MT_MAX(2 * m->pool_cap, m->pool_len + len + 1 + 4096);
        m->pool = mt_realloc(m->pool, m->pool_cap);
    }
    memcpy(m->pool + m->pool_len, key, len);
    m->pool[m->pool_len + len] = 0;
    m->entries[m->count] = (StrMapEntry){.offset = m->pool_len, .length = (uint32_t)len, .value = value};
    m->pool_len += len + 1;
    m->slots[slot] = (int32_t)m->count++;
    return 1;
}

int32_t strmap_get(const StrMap *m, const char *key, size_t len) {
    if (!m->count) return -1;
    int32_t e = m->slots[find_slot(m, key, len)];
    return e >= 0 ? m->entries[e].value : -1;
}

const char *strmap_key(const StrMap *m, size_t i, size_t *len) {
    *len = m->entries[i].length;
    return m->pool + m->entries[i].offset;
}
