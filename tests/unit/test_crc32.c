// test_crc32.c — CRC-32 of checkpoint checksums against known values (zlib's crc32), and
// CRC-32C (TFRecord's) against the check value and RFC 3720's test vectors.
#include <stdio.h>
#include <string.h>

#include "core/crc32.h"
#include "testlib.h"

static void test_known_values(void) {
    CHECK(crc32_update(0, "", 0) == 0, "empty");
    CHECK(crc32_update(0, "123456789", 9) == 0xCBF43926u, "the check value: %08x", crc32_update(0, "123456789", 9));
    const char *fox = "The quick brown fox jumps over the lazy dog";
    CHECK(crc32_update(0, fox, strlen(fox)) == 0x414FA339u, "fox: %08x", crc32_update(0, fox, strlen(fox)));
}

static void test_crc32c_known_values(void) {
    CHECK(crc32c_update(0, "", 0) == 0, "empty");
    CHECK(crc32c_update(0, "123456789", 9) == 0xE3069283u, "the check value: %08x", crc32c_update(0, "123456789", 9));
    unsigned char zeros[32] = {0}, ones[32], ascending[32];
    for (int i = 0; i < 32; i++) ones[i] = 0xFF, ascending[i] = (unsigned char)i;
    CHECK(crc32c_update(0, zeros, 32) == 0x8A9136AAu, "32 zero bytes: %08x", crc32c_update(0, zeros, 32));
    CHECK(crc32c_update(0, ones, 32) == 0x62A8AB43u, "32 0xFF bytes: %08x", crc32c_update(0, ones, 32));
    CHECK(crc32c_update(0, ascending, 32) == 0x46DD794Eu, "0..31: %08x", crc32c_update(0, ascending, 32));
    CHECK(crc32c_update(crc32c_update(0, "12345", 5), "6789", 4) == 0xE3069283u, "in two pieces");
}

static void test_pieces_equal_whole(void) {
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 37 + 11);
    uint32_t whole = crc32_update(0, buf, sizeof(buf));
    for (size_t cut = 0; cut <= 9; cut++) {  // every alignment of the 4-byte steps
        uint32_t parts = crc32_update(crc32_update(0, buf, cut), buf + cut, sizeof(buf) - cut);
        CHECK(parts == whole, "split at %zu: %08x vs %08x", cut, parts, whole);
    }
    buf[500] ^= 1;
    CHECK(crc32_update(0, buf, sizeof(buf)) != whole, "one flipped bit changes it");
}

static void test_file(void) {
    char path[] = "/tmp/moetron_crc32_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    FILE *f = fdopen(fd, "wb");
    for (int i = 0; i < 100000; i++) fputc(i % 251, f);  // past the 64 KiB read buffer
    fclose(f);
    uint32_t crc;
    uint64_t bytes;
    char err[128];
    CHECK(crc32_file(path, &crc, &bytes, err, sizeof(err)) == 0 && bytes == 100000, "read back");
    unsigned char buf[100000];
    for (int i = 0; i < 100000; i++) buf[i] = (unsigned char)(i % 251);
    CHECK(crc == crc32_update(0, buf, sizeof(buf)), "file CRC equals the buffer's");
    remove(path);
    CHECK(crc32_file(path, &crc, &bytes, err, sizeof(err)) == -1 && strstr(err, "cannot open"), "missing file: %s", err);
}

int main(void) {
    RUN(test_known_values);
    RUN(test_crc32c_known_values);
    RUN(test_pieces_equal_whole);
    RUN(test_file);
    return tl_failed_cases != 0;
}
