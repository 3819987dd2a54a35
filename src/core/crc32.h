// crc32.h — CRC-32 (the IEEE / zlib polynomial, reflected 0xEDB88320) of byte buffers and
// files, for checkpoint checksums: any burst error of up to 32 bits, and any odd number of
// flipped bits, changes it. Also CRC-32C (Castagnoli, reflected 0x82F63B78), the checksum
// of TFRecord files (TensorBoard's event files).
#pragma once
#include <stddef.h>
#include <stdint.h>

// Continue a CRC over more bytes: crc32_update(0, ...) starts one.
uint32_t crc32_update(uint32_t crc, const void *data, size_t len);
// The same for CRC-32C: crc32c_update(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c_update(uint32_t crc, const void *data, size_t len);
// CRC-32 and size of a whole file; 0 on success, -1 with err filled when it cannot be read.
int crc32_file(const char *path, uint32_t *crc, uint64_t *bytes, char *err, size_t errlen);
