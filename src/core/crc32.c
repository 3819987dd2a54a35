#include "core/crc32.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/fileio.h"

// Slicing by 4: table[0] is the classic byte-at-a-time table of a reflected polynomial;
// table[k][b] advances the CRC of byte b by k more zero bytes, so four bytes are folded per step.
typedef struct {
    uint32_t polynomial;  // reflected
    int ready;
    uint32_t table[4][256];
} CrcTables;

static CrcTables g_crc32 = {.polynomial = 0xEDB88320u}, g_crc32c = {.polynomial = 0x82F63B78u};

static void build_tables(CrcTables *t) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? t->polynomial ^ (c >> 1) : c >> 1;
        t->table[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int k = 1; k < 4; k++) t->table[k][b] = (t->table[k - 1][b] >> 8) ^ t->table[0][t->table[k - 1][b] & 0xFF];
    t->ready = 1;
}

static uint32_t crc_update(CrcTables *t, uint32_t crc, const void *data, size_t len) {
    if (!t->ready) build_tables(t);
    uint32_t(*table)[256] = t->table;
    const uint8_t *p = data;
    crc = ~crc;
    for (; len >= 4; len -= 4, p += 4) {
        crc ^= (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        crc = table[3][crc & 0xFF] ^ table[2][(crc >> 8) & 0xFF] ^ table[1][(crc >> 16) & 0xFF] ^ table[0][crc >> 24];
    }
    for (; len; len--) crc = table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

uint32_t crc32_update(uint32_t crc, const void *data, size_t len) { return crc_update(&g_crc32, crc, data, len); }

uint32_t crc32c_update(uint32_t crc, const void *data, size_t len) { return crc_update(&g_crc32c, crc, data, len); }

int crc32_file(const char *path, uint32_t *crc, uint64_t *bytes, char *err, size_t errlen) {
    uint64_t size;
    FILE *f = open_input_stream(path, INFILE_DATA, &size, err, errlen);
    if (!f) return -1;
    uint8_t buf[1 << 16];
    uint32_t c = 0;
    uint64_t n = 0;
    for (size_t got; (got = fread(buf, 1, sizeof(buf), f)) > 0; n += got) c = crc32_update(c, buf, got);
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        snprintf(err, errlen, "read error");
        return -1;
    }
    *crc = c;
    *bytes = n;
    return 0;
}
