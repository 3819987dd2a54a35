// tb_event.h — TensorBoard's event files, byte for byte, without protobuf or TensorFlow.
//
// A file is a sequence of TFRecord records:
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. Each record's data is an Event
// protocol buffer (tensorflow/core/util/event.proto, the fields used here):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first event of a file carries file_version "brain.Event:2"; the others one scalar each.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define TFRECORD_OVERHEAD 16        // bytes a record adds around its data: length, its CRC, the data's CRC
#define TB_FILE_VERSION "brain.Event:2"
#define TB_TAG_MAX 256              // the longest tag, in bytes
#define TB_EVENT_MAX (TB_TAG_MAX + 64)  // an encoded scalar Event is at most this long

// The masked CRC-32C TFRecord stores.
uint32_t tfrecord_masked_crc(const void *data, size_t len);
// data (len bytes) framed as one record into out (len + TFRECORD_OVERHEAD bytes); returns
// the bytes written.
size_t tfrecord_frame(uint8_t *out, const uint8_t *data, size_t len);

// The Event that opens a file: wall_time and file_version (step 0). out holds TB_EVENT_MAX
// bytes; returns the encoded length.
size_t tb_event_file_version(uint8_t *out, double wall_time);
// An Event of one scalar; tag is at most TB_TAG_MAX bytes (longer is a programming error).
// out holds TB_EVENT_MAX bytes; returns the encoded length.
size_t tb_event_scalar(uint8_t *out, double wall_time, int64_t step, const char *tag, float value);
