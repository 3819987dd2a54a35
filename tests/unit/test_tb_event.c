// test_tb_event.c — TensorBoard events byte for byte: the Event protocol buffers against
// the bytes tensorboard's own event_pb2 serialises for the same fields, and the TFRecord
// framing (length, masked CRC-32C of it, data, masked CRC-32C of the data) against
// tensorboard's masked_crc32c.
#include <stdint.h>
#include <string.h>

#include "core/tb_event.h"
#include "testlib.h"

// hex text of bytes, for the messages
static const char *hex(const uint8_t *b, size_t n) {
    static char out[2 * TB_EVENT_MAX + 1];
    for (size_t i = 0; i < n && i < TB_EVENT_MAX; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
    return out;
}

// the bytes of a hex string into out; returns their count
static size_t unhex(const char *text, uint8_t *out) {
    size_t n = strlen(text) / 2;
    for (size_t i = 0; i < n; i++) sscanf(text + 2 * i, "%2hhx", &out[i]);
    return n;
}

static void check_bytes(const uint8_t *got, size_t got_len, const char *want_hex, const char *what) {
    uint8_t want[TB_EVENT_MAX];
    size_t want_len = unhex(want_hex, want);
    CHECK(got_len == want_len && !memcmp(got, want, want_len), "%s: %s, expected %s", what, hex(got, got_len),
          want_hex);
}

// event_pb2.Event(wall_time=..., step=..., summary=Summary(value=[Value(tag=..., simple_value=...)]))
static void test_scalar_events(void) {
    uint8_t event[TB_EVENT_MAX];
    size_t n = tb_event_scalar(event, 1700000000.25, 300, "lm loss", 2.5f);
    check_bytes(event, n, "0900001040fc54d94110ac022a100a0e0a076c6d206c6f73731500002040", "lm loss at step 300");
    n = tb_event_scalar(event, 0.5, -1, "x", -1.0f);  // a negative int64 is a 10-byte varint
    check_bytes(event, n, "09000000000000e03f10ffffffffffffffffff012a0a0a080a017815000080bf", "x at step -1");
}

static void test_file_version_event(void) {
    uint8_t event[TB_EVENT_MAX];
    size_t n = tb_event_file_version(event, 1700000000.25);
    check_bytes(event, n, "0900001040fc54d9411a0d627261696e2e4576656e743a32", "brain.Event:2");
}

// A tag as long as allowed still fits TB_EVENT_MAX (its length takes a 2-byte varint).
static void test_longest_tag(void) {
    char tag[TB_TAG_MAX + 1];
    memset(tag, 'a', TB_TAG_MAX);
    tag[TB_TAG_MAX] = 0;
    uint8_t event[TB_EVENT_MAX];
    size_t n = tb_event_scalar(event, 1, INT64_MAX, tag, 1);
    CHECK(n <= TB_EVENT_MAX, "%zu bytes", n);
    CHECK(!memcmp(event + n - 5 - TB_TAG_MAX, tag, TB_TAG_MAX), "the tag's bytes end 5 bytes before the end");
}

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

static void test_record_framing(void) {
    // masked CRC-32C values of tensorboard's compat.tensorflow_stub masked_crc32c
    CHECK(tfrecord_masked_crc("123456789", 9) == 0xc78ab0e5u, "masked check value: %08x",
          tfrecord_masked_crc("123456789", 9));
    uint8_t out[3 + TFRECORD_OVERHEAD];
    size_t n = tfrecord_frame(out, (const uint8_t *)"abc", 3);
    CHECK(n == sizeof(out), "record of 3 bytes is %zu bytes", n);
    static const uint8_t length[8] = {3, 0, 0, 0, 0, 0, 0, 0};
    CHECK(!memcmp(out, length, 8), "uint64 length, little-endian");
    CHECK(le32(out + 8) == 0x0e4999b0u, "masked CRC of the length: %08x", le32(out + 8));
    CHECK(!memcmp(out + 12, "abc", 3), "the data");
    CHECK(le32(out + 15) == 0x21f1576eu, "masked CRC of the data: %08x", le32(out + 15));
}

int main(void) {
    RUN(test_scalar_events);
    RUN(test_file_version_event);
    RUN(test_longest_tag);
    RUN(test_record_framing);
    TESTS_DONE();
}
