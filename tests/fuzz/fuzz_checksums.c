// fuzz_checksums.c — checksums.json, the CRC-32 manifest checkpoint_save writes last into
// every iteration directory and checkpoint_load verifies first: through
// checkpoint_verify_checksums (train/checkpoint.c, CRC-32 of core/crc32.c) on a directory
// holding the manifest and one more file.
// Input: u32 little-endian n, then n bytes of checksums.json, then the bytes of
// model.safetensors (n is cut to what the input holds). tests/fuzz/corpus/checksums/ has
// manifests written by moetron with the file they list (tests/fuzz/make_seeds.py).
// Oracle: a manifest verifies exactly when it is right: "algorithm": "crc32" and each entry
// of "files" a file of the directory (model.safetensors; checksums.json itself, in theory)
// with its true "bytes" and "crc32".
#include <stdio.h>
#include <string.h>

#include "core/crc32.h"
#include "core/json.h"
#include "fuzz.h"
#include "train/checkpoint.h"

static void verify(void *ctx) {
    (void)ctx;
    checkpoint_verify_checksums(fuzz_dir());
}

// Whether the entry name: {"bytes": ..., "crc32": ...} is the file want_name holding data:
// its size, and its CRC-32 in lower-case hex as moetron writes it.
static int entry_is_right(const char *name, const JsonValue *entry, const char *want_name, const uint8_t *data,
                          size_t size) {
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", crc32_update(0, data, size));
    const char *crc = json_get_string(entry, "crc32");
    int64_t bytes;
    return !strcmp(name, want_name) && crc && !strcmp(crc, hex) && json_get_int64(entry, "bytes", &bytes) &&
           bytes >= 0 && (uint64_t)bytes == size;
}

// Whether the manifest (in->first) is right for the directory: "algorithm": "crc32" and every
// entry of "files" one of the two files there, model.safetensors (in->second) or
// checksums.json itself.
static int manifest_is_right(const FuzzPair *in) {
    char err[512];
    JsonValue *root = json_parse((const char *)in->first, in->first_size, err, sizeof err);
    const JsonValue *files = json_get(root, "files");
    const char *algorithm = json_get_string(root, "algorithm");
    int right = files && files->type == JSON_OBJECT && algorithm && !strcmp(algorithm, "crc32");
    for (size_t i = 0; right && i < files->count; i++)
        right = entry_is_right(files->keys[i], &files->items[i], "model.safetensors", in->second, in->second_size) ||
                entry_is_right(files->keys[i], &files->items[i], "checksums.json", in->first, in->first_size);
    json_free(root);
    return right;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzPair in = fuzz_split(data, size);
    fuzz_write("checksums.json", in.first, in.first_size);
    fuzz_write("model.safetensors", in.second, in.second_size);
    int verified = fuzz_run(verify, NULL) == FUZZ_RETURNED;
    int right = manifest_is_right(&in);
    if (verified && !right)
        fuzz_fail("checksums.json verified, but it lists a file that is not there or not at its size and CRC-32");
    if (!verified && right) fuzz_fail("a right checksums.json did not verify: %s", fuzz_error());
    return 0;
}
