// tb_event.c — protocol-buffer encoding of TensorBoard Events and TFRecord framing.
#include "core/tb_event.h"

#include <string.h>

#include "core/common.h"
#include "core/crc32.h"

enum { CRC_MASK_DELTA = 0xa282ead8u };

// protobuf wire types
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };
// field numbers of event.proto / summary.proto
enum { EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5 };
enum { SUMMARY_VALUE = 1, VALUE_TAG = 1, VALUE_SIMPLE_VALUE = 2 };

uint32_t tfrecord_masked_crc(const void *data, size_t len) {
    uint32_t crc = crc32c_update(0, data, len);
    return ((crc >> 15) | (crc << 17)) + CRC_MASK_DELTA;
}

static uint8_t *put_le(uint8_t *out, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; i++) *out++ = (uint8_t)(value >> (8 * i));
    return out;
}

size_t tfrecord_frame(uint8_t *out, const uint8_t *data, size_t len) {
    uint8_t *p = put_le(out, len, 8);
    p = put_le(p, tfrecord_masked_crc(out, 8), 4);
    memcpy(p, data, len);
    p = put_le(p + len, tfrecord_masked_crc(data, len), 4);
    return (size_t)(p - out);
}

// ---- protobuf encoding: out advances past what is written -----------------------------

static uint8_t *put_varint(uint8_t *out, uint64_t value) {
    for (; value >= 0x80; value >>= 7) *out++ = (uint8_t)(value | 0x80);
    *out++ = (uint8_t)value;
    return out;
}

static uint8_t *put_key(uint8_t *out, int field, int wire) { return put_varint(out, (uint64_t)field << 3 | wire); }

static uint8_t *put_bytes(uint8_t *out, int field, const void *data, size_t len) {
    out = put_varint(put_key(out, field, WIRE_BYTES), len);
    memcpy(out, data, len);
    return out + len;
}

static uint8_t *put_double(uint8_t *out, int field, double value) {
    uint64_t bits;
    memcpy(&bits, &value, sizeof(bits));
    return put_le(put_key(out, field, WIRE_FIXED64), bits, 8);
}

static uint8_t *put_float(uint8_t *out, int field, float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof(bits));
    return put_le(put_key(out, field, WIRE_FIXED32), bits, 4);
}

// int64 fields are varints of the two's-complement bits (a negative step takes 10 bytes)
static uint8_t *put_int64(uint8_t *out, int field, int64_t value) {
    return put_varint(put_key(out, field, WIRE_VARINT), (uint64_t)value);
}

size_t tb_event_file_version(uint8_t *out, double wall_time) {
    uint8_t *p = put_double(out, EVENT_WALL_TIME, wall_time);
    p = put_bytes(p, EVENT_FILE_VERSION, TB_FILE_VERSION, strlen(TB_FILE_VERSION));
    return (size_t)(p - out);
}

size_t tb_event_scalar(uint8_t *out, double wall_time, int64_t step, const char *tag, float value) {
    size_t tag_len = strlen(tag);
    MT_ASSERT(tag_len <= TB_TAG_MAX);
    uint8_t value_msg[TB_TAG_MAX + 16], summary[TB_TAG_MAX + 32];
    uint8_t *v = put_float(put_bytes(value_msg, VALUE_TAG, tag, tag_len), VALUE_SIMPLE_VALUE, value);
    uint8_t *s = put_bytes(summary, SUMMARY_VALUE, value_msg, (size_t)(v - value_msg));
    uint8_t *p = put_int64(put_double(out, EVENT_WALL_TIME, wall_time), EVENT_STEP, step);
    p = put_bytes(p, EVENT_SUMMARY, summary, (size_t)(s - summary));
    return (size_t)(p - out);
}
