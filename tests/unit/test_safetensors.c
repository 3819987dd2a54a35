// test_safetensors.c — writer/reader round trip (every dtype, scalars, empty
// tensors, metadata, layout details), dtype conversions, every header
// rejection reason (bad files built byte by byte in /tmp), truncation at every
// byte offset, and random byte flips that must never crash the reader.
#include "core/safetensors.h"
#include "core/rng.h"
#include "testlib.h"

#include <string.h>
#include <unistd.h>

static void temp_path(char *buf, size_t n, const char *tag) {
    snprintf(buf, n, "/tmp/moetron_test_st_%ld_%s.safetensors", (long)getpid(), tag);
}

static void write_bytes(const char *path, const void *data, size_t len) {
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        printf("cannot write %s\n", path);
        exit(1);
    }
    if (len) fwrite(data, 1, len, fp);
    fclose(fp);
}

// [header_len as u64 LE][header][data_len bytes of 0x11]
static void write_raw(const char *path, uint64_t header_len, const char *header, size_t data_len) {
    size_t hl = strlen(header), n = 8 + hl + data_len;
    uint8_t *buf = malloc(n);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(header_len >> (8 * i));
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, 0x11, data_len);
    write_bytes(path, buf, n);
    free(buf);
}

// Opening a file made of `header` + data_len bytes must fail with `expect` in err.
static void check_rejected_header(const char *header, size_t data_len, const char *expect) {
    char path[256], err[512] = "";
    temp_path(path, sizeof path, "bad");
    write_raw(path, strlen(header), header, data_len);
    StFile f;
    int rc = st_open(&f, path, err, sizeof err);
    CHECK(rc != 0, "accepted header %s", header);
    CHECK(strstr(err, expect) != NULL, "header %s: error \"%s\" lacks \"%s\"", header, err, expect);
    CHECK(f.n_tensors == 0 && f.bytes == NULL, "failed open left state behind");
    st_close(&f);
    remove(path);
}

static void test_dtypes(void) {
    const char *names[] = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2",
                           "I64", "I32", "I16", "I8",   "U8",      "BOOL"};
    size_t sizes[] = {8, 4, 2, 2, 1, 1, 8, 4, 2, 1, 1, 1};
    for (int d = 0; d < ST_DTYPE_COUNT; d++) {
        StDtype back;
        CHECK(strcmp(st_dtype_name((StDtype)d), names[d]) == 0, "name of %d", d);
        CHECK(st_dtype_size((StDtype)d) == sizes[d], "size of %s", names[d]);
        CHECK(st_dtype_from_name(names[d], &back) && back == (StDtype)d, "from name %s", names[d]);
    }
    StDtype x;
    CHECK(!st_dtype_from_name("f32", &x) && !st_dtype_from_name("", &x), "bad names accepted");
    CHECK(st_dtype_size(ST_DTYPE_COUNT) == 0 && strcmp(st_dtype_name(ST_DTYPE_COUNT), "?") == 0, "out of range");
}

static void test_round_trip_all_dtypes(void) {
    char path[256], err[512] = "";
    temp_path(path, sizeof path, "rt");
    float f32[6] = {1, -2, 3.5f, 0, 1e-30f, -7};
    int64_t i64[3] = {INT64_MIN, 0, INT64_MAX};
    uint16_t bf16[3] = {0x3F80, 0xC0A0, 0x7F80};                           // 1, -5, inf
    uint16_t f16[7] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0x8000, 0x3555};  // 1 -2 65504 2^-24 inf -0 ~1/3
    uint8_t u8[5] = {0, 1, 127, 128, 255};
    uint8_t boolean[2] = {1, 0};
    double f64[2] = {0.1, -1e300};
    uint8_t e4m3[5] = {0x38, 0xC0, 0x7E, 0x01, 0x7F};  // 1 -2 448 2^-9 NaN
    uint8_t e5m2[3] = {0x3C, 0x7B, 0x7C};              // 1 57344 inf
    float scalar = 42;
    real reals[4] = {(real)0.5, (real)-1.25, (real)0.1, (real)3e5};

    StWriter w;
    stw_init(&w);
    stw_meta(&w, "step", "100");
    stw_meta(&w, "note", "hello \"world\"\n");
    stw_meta(&w, "step", "200");  // replaces
    stw_add(&w, "f32", ST_F32, 2, (int64_t[]){2, 3}, f32);
    stw_add(&w, "i64", ST_I64, 1, (int64_t[]){3}, i64);
    stw_add(&w, "bf16", ST_BF16, 1, (int64_t[]){3}, bf16);
    stw_add(&w, "f16", ST_F16, 1, (int64_t[]){7}, f16);
    stw_add(&w, "u8", ST_U8, 1, (int64_t[]){5}, u8);
    stw_add(&w, "bool", ST_BOOL, 2, (int64_t[]){1, 2}, boolean);
    stw_add(&w, "f64", ST_F64, 1, (int64_t[]){2}, f64);
    stw_add(&w, "e4m3", ST_F8_E4M3, 1, (int64_t[]){5}, e4m3);
    stw_add(&w, "e5m2", ST_F8_E5M2, 1, (int64_t[]){3}, e5m2);
    stw_add(&w, "scalar", ST_F32, 0, NULL, &scalar);
    stw_add(&w, "empty", ST_F32, 2, (int64_t[]){0, 4}, NULL);
    stw_add_real(&w, "layers.0.w", 2, (int64_t[]){2, 2}, reals);
    reals[0] = 99;  // the writer kept its own copy
    CHECK(stw_finish(&w, path, err, sizeof err) == 0, "finish: %s", err);
    CHECK(w.n_tensors == 0 && w.tensors == NULL, "writer not freed");

    StFile f;
    CHECK(st_open(&f, path, err, sizeof err) == 0, "open: %s", err);
    if (f.n_tensors == 0) return;
    const char *order[] = {"f32", "i64", "bf16", "f16", "u8", "bool", "f64", "e4m3", "e5m2", "scalar", "empty",
                           "layers.0.w"};
    CHECK(f.n_tensors == 12, "n_tensors %d", f.n_tensors);
    uint64_t offset = 0;
    for (int i = 0; i < f.n_tensors && i < 12; i++) {
        CHECK(strcmp(f.tensors[i].name, order[i]) == 0, "tensor %d is %s", i, f.tensors[i].name);
        CHECK(f.tensors[i].begin == offset, "%s not contiguous", order[i]);
        offset = f.tensors[i].end;
    }
    CHECK(f.data_start % 8 == 0, "header not padded to 8 (data_start %zu)", f.data_start);
    CHECK(memcmp(f.bytes + 8, "{\"__metadata__\":{\"format\":\"pt\"", 30) == 0, "metadata not first: %.60s",
          (const char *)f.bytes + 8);
    CHECK(f.bytes[f.data_start - 1] == ' ' || f.bytes[f.data_start - 1] == '}', "padding");
    CHECK(st_meta(&f, "format") && strcmp(st_meta(&f, "format"), "pt") == 0, "format");
    CHECK(st_meta(&f, "step") && strcmp(st_meta(&f, "step"), "200") == 0, "step");
    CHECK(st_meta(&f, "note") && strcmp(st_meta(&f, "note"), "hello \"world\"\n") == 0, "escaped meta");
    CHECK(st_meta(&f, "missing") == NULL && f.n_meta == 3, "meta count %d", f.n_meta);

    real out[8];
    const StTensor *t = st_find(&f, "f32");
    CHECK(t && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->dtype == ST_F32, "f32 header");
    CHECK(t && st_read_real(&f, t, out) == 0, "read f32");
    for (int i = 0; i < 6; i++) CHECK(out[i] == (real)f32[i], "f32[%d]", i);

    t = st_find(&f, "i64");
    CHECK(t && st_read_real(&f, t, out) != 0, "integer tensor read as real");
    CHECK(t && memcmp(st_data(&f, t), i64, sizeof i64) == 0, "i64 raw bytes");
    t = st_find(&f, "u8");
    CHECK(t && memcmp(st_data(&f, t), u8, 5) == 0 && st_read_real(&f, t, out) != 0, "u8");
    t = st_find(&f, "bool");
    CHECK(t && t->dtype == ST_BOOL && memcmp(st_data(&f, t), boolean, 2) == 0, "bool");

    t = st_find(&f, "bf16");
    CHECK(t && st_read_real(&f, t, out) == 0 && out[0] == 1 && out[1] == -5 && isinf(out[2]) && out[2] > 0,
          "bf16 values");
    t = st_find(&f, "f16");
    CHECK(t && st_read_real(&f, t, out) == 0, "read f16");
    CHECK(out[0] == 1 && out[1] == -2 && out[2] == 65504 && out[3] == (real)ldexp(1.0, -24), "f16 values");
    CHECK(isinf(out[4]) && out[5] == 0 && signbit(out[5]), "f16 inf / -0");
    CHECK_CLOSE(out[6], 0.333251953125, 0, 0, "f16 1/3");
    t = st_find(&f, "f64");
    CHECK(t && st_read_real(&f, t, out) == 0 && out[0] == (real)0.1 && out[1] == (real)-1e300, "f64 values");
    t = st_find(&f, "e4m3");
    CHECK(t && st_read_real(&f, t, out) == 0, "read e4m3");
    CHECK(out[0] == 1 && out[1] == -2 && out[2] == 448 && out[3] == (real)ldexp(1.0, -9) && isnan(out[4]),
          "e4m3 values %g %g %g %g %g", (double)out[0], (double)out[1], (double)out[2], (double)out[3],
          (double)out[4]);
    t = st_find(&f, "e5m2");
    CHECK(t && st_read_real(&f, t, out) == 0 && out[0] == 1 && out[1] == 57344 && isinf(out[2]), "e5m2");

    t = st_find(&f, "scalar");
    CHECK(t && t->ndim == 0 && st_numel(t) == 1 && st_read_real(&f, t, out) == 0 && out[0] == 42, "scalar");
    t = st_find(&f, "empty");
    CHECK(t && st_numel(t) == 0 && t->begin == t->end && st_read_real(&f, t, out) == 0, "empty tensor");
    t = st_find(&f, "layers.0.w");
    CHECK(t && t->dtype == ST_F32 && st_read_real(&f, t, out) == 0, "real tensor");
    CHECK(out[0] == (real)0.5f && out[1] == (real)-1.25f && out[2] == (real)0.1f && out[3] == (real)3e5f,
          "real values");
    CHECK(st_find(&f, "nope") == NULL && st_find(&f, "") == NULL, "st_find of a missing name");
    st_close(&f);
    st_close(&f);  // harmless twice
    remove(path);
}

static void test_find_among_many(void) {
    char path[256], err[512] = "";
    temp_path(path, sizeof path, "many");
    enum { N = 300 };
    static float values[N];
    char name[32];
    StWriter w;
    stw_init(&w);
    for (int i = N - 1; i >= 0; i--) {
        values[i] = (float)i;
        snprintf(name, sizeof name, "layer.%d.weight", i);
        stw_add(&w, name, ST_F32, 1, (int64_t[]){1}, &values[i]);
    }
    CHECK(stw_finish(&w, path, err, sizeof err) == 0, "%s", err);
    StFile f;
    CHECK(st_open(&f, path, err, sizeof err) == 0, "%s", err);
    int wrong = 0;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "layer.%d.weight", i);
        const StTensor *t = st_find(&f, name);
        real v = -1;
        if (!t || st_read_real(&f, t, &v) || v != (real)i) wrong++;
    }
    CHECK(wrong == 0, "%d lookups wrong", wrong);
    CHECK(st_find(&f, "layer.300.weight") == NULL, "found a missing tensor");
    st_close(&f);
    remove(path);
}

static void test_empty_file_with_only_metadata(void) {
    char path[256], err[512] = "";
    temp_path(path, sizeof path, "nometa");
    StWriter w;
    stw_init(&w);
    stw_meta(&w, "format", "np");  // overrides the default
    CHECK(stw_finish(&w, path, err, sizeof err) == 0, "%s", err);
    StFile f;
    CHECK(st_open(&f, path, err, sizeof err) == 0, "%s", err);
    CHECK(f.n_tensors == 0 && f.n_meta == 1 && strcmp(st_meta(&f, "format"), "np") == 0, "only metadata");
    CHECK(f.size == f.data_start, "no data expected");
    st_close(&f);
    // A header without __metadata__ at all is valid too.
    write_raw(path, 2, "{}", 0);
    CHECK(st_open(&f, path, err, sizeof err) == 0, "bare {} rejected: %s", err);
    CHECK(st_meta(&f, "format") == NULL, "format invented");
    st_close(&f);
    remove(path);
}

static void test_writer_errors(void) {
    char path[256], err[512] = "";
    temp_path(path, sizeof path, "dup");
    remove(path);
    float x[2] = {1, 2};
    StWriter w;
    stw_init(&w);
    stw_add(&w, "a", ST_F32, 1, (int64_t[]){2}, x);
    stw_add(&w, "b", ST_F32, 1, (int64_t[]){2}, x);
    stw_add(&w, "a", ST_F32, 1, (int64_t[]){1}, x);
    CHECK(stw_finish(&w, path, err, sizeof err) != 0, "duplicate names written");
    CHECK(strstr(err, "duplicate tensor name \"a\""), "err: %s", err);
    CHECK(access(path, F_OK) != 0, "a file was created despite the error");

    stw_init(&w);
    stw_add(&w, "a", ST_F32, 1, (int64_t[]){2}, x);
    CHECK(stw_finish(&w, "/tmp/moetron_no_such_dir/x.safetensors", err, sizeof err) != 0, "wrote to missing dir");
    CHECK(strstr(err, "cannot create"), "err: %s", err);

    stw_init(&w);
    stw_add(&w, "a", ST_F32, 1, (int64_t[]){2}, x);
    stw_discard(&w);
    CHECK(w.n_tensors == 0, "discard");
}

static void test_rejects_bad_framing(void) {
    char path[256], err[512] = "";
    temp_path(path, sizeof path, "frame");
    StFile f;
    write_bytes(path, "", 0);
    CHECK(st_open(&f, path, err, sizeof err) != 0 && strstr(err, "only 0 bytes"), "empty file: %s", err);
    write_bytes(path, "\x05\0\0\0\0", 5);
    CHECK(st_open(&f, path, err, sizeof err) != 0 && strstr(err, "only 5 bytes"), "5-byte file: %s", err);
    write_raw(path, 200000000, "{}", 0);
    CHECK(st_open(&f, path, err, sizeof err) != 0 && strstr(err, "exceeds the limit"), "huge N: %s", err);
    write_raw(path, UINT64_MAX, "{}", 0);
    CHECK(st_open(&f, path, err, sizeof err) != 0 && strstr(err, "exceeds the limit"), "N=2^64-1: %s", err);
    write_raw(path, 100, "{}", 0);
    CHECK(st_open(&f, path, err, sizeof err) != 0 && strstr(err, "truncated"), "N past EOF: %s", err);
    write_raw(path, 0, "", 0);
    CHECK(st_open(&f, path, err, sizeof err) != 0 && strstr(err, "not valid JSON"), "N=0: %s", err);
    CHECK(st_open(&f, "/tmp/moetron_no_such.safetensors", err, sizeof err) != 0 && strstr(err, "cannot open"),
          "missing file: %s", err);
    remove(path);
}

#define GOOD_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static void test_rejects_bad_headers(void) {
    // Sanity: the building block itself is valid.
    char path[256], err[512] = "";
    temp_path(path, sizeof path, "good");
    write_raw(path, strlen("{" GOOD_A "}"), "{" GOOD_A "}", 8);
    StFile f;
    CHECK(st_open(&f, path, err, sizeof err) == 0, "good file rejected: %s", err);
    st_close(&f);
    remove(path);

    check_rejected_header("{not json", 0, "not valid JSON: line 1 column 2");
    check_rejected_header("{" GOOD_A "} x", 8, "not valid JSON");
    check_rejected_header("[1,2]", 0, "not a JSON object");
    check_rejected_header("\"str\"", 0, "not a JSON object");
    check_rejected_header("{\"a\":5}", 0, "entry is not an object");
    check_rejected_header("{\"a\":{\"dtype\":\"F128\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\\u0000\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                          "unknown dtype");
    check_rejected_header("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "missing or non-string \"dtype\"");
    check_rejected_header("{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "non-string \"dtype\"");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "\"shape\" is missing");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "not an array");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
                          "non-negative integers");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8,
                          "non-negative integers");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
                          "non-negative integers");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
                          "non-negative integers");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8,
                          "non-negative integers");
    check_rejected_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
                          "9 dimensions");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "\"data_offsets\" must be");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8, "data_offsets");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "begin <= end");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}}", 8, "data_offsets");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, "data_offsets");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":{}}}", 8, "data_offsets");
    check_rejected_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                          "span 8 bytes but its shape and dtype need 12");
    check_rejected_header("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,8]}}", 8,
                          "shape is too large");
    check_rejected_header("{\"a\":{\"dtype\":\"F64\",\"shape\":[1152921504606846976,16],\"data_offsets\":[0,8]}}", 8,
                          "shape is too large");
}

static void test_rejects_bad_layout(void) {
    check_rejected_header("{" GOOD_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
                          "tensors \"a\" and \"b\" overlap");
    check_rejected_header("{" GOOD_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "overlap");
    check_rejected_header("{" GOOD_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, "overlap");
    check_rejected_header("{" GOOD_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20,
                          "hole in the data: bytes 8..12");
    check_rejected_header("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "hole");
    check_rejected_header("{" GOOD_A "}", 4, "truncated: the tensors need 8 data bytes but the file has 4");
    check_rejected_header("{" GOOD_A "}", 12, "trailing bytes: 4 bytes after the last tensor");
    check_rejected_header("{}", 1, "trailing bytes");
    check_rejected_header("{" GOOD_A "," GOOD_A "}", 8, "duplicate tensor name \"a\"");
    check_rejected_header("{" GOOD_A ",\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16,
                          "duplicate tensor name \"a\"");
    check_rejected_header("{\"a\\u0000x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "NUL");
    // Zero-size tensors at the boundaries are fine.
    char path[256], err[512] = "";
    temp_path(path, sizeof path, "zero");
    const char *ok = "{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}," GOOD_A
                     ",\"y\":{\"dtype\":\"I8\",\"shape\":[3,0],\"data_offsets\":[8,8]}}";
    write_raw(path, strlen(ok), ok, 8);
    StFile f;
    CHECK(st_open(&f, path, err, sizeof err) == 0 && f.n_tensors == 3, "zero-size tensors rejected: %s", err);
    st_close(&f);
    remove(path);
}

static void test_rejects_bad_metadata(void) {
    check_rejected_header("{\"__metadata__\":{\"k\":1}," GOOD_A "}", 8, "__metadata__ value for \"k\" is not a string");
    check_rejected_header("{\"__metadata__\":{\"k\":null}}", 0, "not a string");
    check_rejected_header("{\"__metadata__\":{\"k\":{}}}", 0, "not a string");
    check_rejected_header("{\"__metadata__\":[]}", 0, "__metadata__ is not an object");
    check_rejected_header("{\"__metadata__\":\"x\"}", 0, "__metadata__ is not an object");
    check_rejected_header("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate \"__metadata__\"");
    check_rejected_header("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate __metadata__ key \"k\"");
    check_rejected_header("{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0, "NUL");
}

// Dimensions whose partial products overflow int64 are fine in an empty tensor (a 0
// anywhere): st_numel is 0, not signed overflow (found by tests/fuzz/fuzz_safetensors).
// A shape too large for the file is one clear error.
static void test_huge_dimensions(void) {
    char path[256], err[512] = "";
    temp_path(path, sizeof path, "huge");
    const char *empty = "{\"e\":{\"dtype\":\"F32\",\"shape\":[4294967296,2147483648,0],\"data_offsets\":[0,0]}}";
    write_raw(path, strlen(empty), empty, 0);
    StFile f;
    CHECK(st_open(&f, path, err, sizeof err) == 0, "empty tensor with huge dimensions rejected: %s", err);
    if (f.n_tensors == 1) {
        CHECK(st_numel(&f.tensors[0]) == 0, "numel %lld", (long long)st_numel(&f.tensors[0]));
        real out[1];
        CHECK(st_read_real(&f, &f.tensors[0], out) == 0, "read of an empty tensor");
    }
    st_close(&f);
    check_rejected_header("{\"e\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,8]}}", 8,
                          "shape is too large");
    check_rejected_header("{\"e\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551615]}}", 8,
                          "data_offsets");
    remove(path);
}

// A small valid file's bytes, for the truncation and mutation tests.
static uint8_t *small_valid_file(const char *path, size_t *size) {
    float a[3] = {1, 2, 3};
    uint16_t b[2] = {0x3C00, 0x4000};
    int32_t c[1] = {7};
    StWriter w;
    stw_init(&w);
    stw_meta(&w, "k", "v");
    stw_add(&w, "a", ST_F32, 1, (int64_t[]){3}, a);
    stw_add(&w, "b", ST_F16, 2, (int64_t[]){1, 2}, b);
    stw_add(&w, "c", ST_I32, 0, NULL, c);
    char err[256];
    if (stw_finish(&w, path, err, sizeof err)) {
        printf("cannot write the sample file: %s\n", err);
        exit(1);
    }
    FILE *fp = fopen(path, "rb");
    fseek(fp, 0, SEEK_END);
    *size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *bytes = malloc(*size);
    if (fread(bytes, 1, *size, fp) != *size) exit(1);
    fclose(fp);
    return bytes;
}

static void test_truncation_at_every_offset(void) {
    char path[256], err[512];
    temp_path(path, sizeof path, "trunc");
    size_t size;
    uint8_t *bytes = small_valid_file(path, &size);
    StFile f;
    CHECK(st_open(&f, path, err, sizeof err) == 0, "full file rejected: %s", err);
    st_close(&f);
    int accepted = 0;
    for (size_t cut = 0; cut < size; cut++) {
        write_bytes(path, bytes, cut);
        err[0] = '\0';
        if (st_open(&f, path, err, sizeof err) == 0) accepted++;
        else CHECK(err[0] != '\0', "no message at cut %zu", cut);
        st_close(&f);
    }
    CHECK(accepted == 0, "%d truncated files accepted", accepted);
    free(bytes);
    remove(path);
}

// Whatever st_open accepts must be safe to use: offsets inside the file and
// conversions within bounds (ASan checks the reads).
static void exercise_opened_file(const StFile *f) {
    for (int i = 0; i < f->n_tensors; i++) {
        const StTensor *t = &f->tensors[i];
        CHECK(t->end <= f->size - f->data_start, "tensor past EOF accepted");
        CHECK(st_find(f, t->name) == t, "st_find mismatch");
        int64_t n = st_numel(t);
        if (n > 1 << 20) continue;
        real *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
        st_read_real(f, t, out);
        free(out);
    }
}

static void test_random_byte_flips(void) {
    char path[256], err[512];
    temp_path(path, sizeof path, "flip");
    size_t size;
    uint8_t *bytes = small_valid_file(path, &size);
    uint8_t *mutated = malloc(size + 16);
    Rng rng;
    rng_seed(&rng, 7);
    const char interesting[] = "0123456789[]{},:\"-.eE \x00\xff";
    int accepted = 0;
    for (int iter = 0; iter < 4000; iter++) {
        memcpy(mutated, bytes, size);
        int flips = 1 + (int)rng_below(&rng, 3);
        for (int k = 0; k < flips; k++) {
            // Mostly the header (where the interesting bugs live), sometimes anywhere.
            size_t at = rng_below(&rng, 4) ? 8 + rng_below(&rng, size - 8) : rng_below(&rng, size);
            uint64_t how = rng_below(&rng, 3);
            if (how == 0) mutated[at] ^= (uint8_t)(1u << rng_below(&rng, 8));
            else if (how == 1) mutated[at] = (uint8_t)interesting[rng_below(&rng, sizeof interesting - 1)];
            else mutated[at] = (uint8_t)rng_u64(&rng);
        }
        size_t len = size;
        if (rng_below(&rng, 10) == 0) len += rng_below(&rng, 16);  // junk appended
        write_bytes(path, mutated, len);
        StFile f;
        if (st_open(&f, path, err, sizeof err) == 0) {
            accepted++;
            exercise_opened_file(&f);
        }
        st_close(&f);
    }
    CHECK(accepted > 0, "no mutation was accepted at all (padding/data flips should be)");
    free(mutated);
    free(bytes);
    remove(path);
}

// The streaming writer writes the bytes stw_finish writes for the same tensors, whatever
// the pieces the values come in (here pieces that cross tensor boundaries, an empty tensor
// in the middle, BF16 and F32).
static uint8_t *read_all(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    *len = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *bytes = malloc(*len ? *len : 1);
    if (fread(bytes, 1, *len, fp) != *len) *len = 0;
    fclose(fp);
    return bytes;
}

static void test_streaming_writer_matches_finish(void) {
    char whole[256], streamed[256], err[512] = "";
    temp_path(whole, sizeof whole, "whole");
    temp_path(streamed, sizeof streamed, "streamed");
    enum { A = 5000, B = 3 };  // A spans more than one conversion chunk
    real values[A + B];
    for (int i = 0; i < A + B; i++) values[i] = (real)(0.001 * i - 1.7);
    const int64_t shape_a[2] = {50, 100}, shape_e[1] = {0}, shape_b[1] = {B};
    StWriter w;
    stw_init(&w);
    stw_add_real_view(&w, "a", ST_BF16, 2, shape_a, values);
    stw_add_real_view(&w, "empty", ST_F32, 1, shape_e, values);
    stw_add_real_view(&w, "b", ST_F32, 1, shape_b, values + A);
    CHECK(stw_finish(&w, whole, err, sizeof err) == 0, "finish: %s", err);
    stw_init(&w);
    stw_declare(&w, "a", ST_BF16, 2, shape_a);
    stw_declare(&w, "empty", ST_F32, 1, shape_e);
    stw_declare(&w, "b", ST_F32, 1, shape_b);
    CHECK(stw_stream_open(&w, streamed, err, sizeof err) == 0, "stream open: %s", err);
    const size_t pieces[] = {1, 4096, A - 4097 - 1, 2, B - 1};  // the fourth runs from a into b
    size_t at = 0;
    for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
        stw_stream_values(&w, values + at, pieces[p]);
        at += pieces[p];
    }
    CHECK(at == A + B, "pieces cover %zu values", at);
    CHECK(stw_stream_close(&w, err, sizeof err) == 0, "stream close: %s", err);
    size_t n_whole = 0, n_streamed = 0;
    uint8_t *a = read_all(whole, &n_whole), *b = read_all(streamed, &n_streamed);
    CHECK(a && b && n_whole > 0 && n_whole == n_streamed && memcmp(a, b, n_whole) == 0,
          "streamed file differs (%zu vs %zu bytes)", n_streamed, n_whole);
    free(a);
    free(b);
    // a stream given too few values writes nothing
    remove(streamed);
    stw_init(&w);
    stw_declare(&w, "b", ST_F32, 1, shape_b);
    CHECK(stw_stream_open(&w, streamed, err, sizeof err) == 0, "stream open: %s", err);
    stw_stream_values(&w, values, B - 1);
    CHECK(stw_stream_close(&w, err, sizeof err) != 0 && strstr(err, "\"b\" was not given all its values"),
          "short stream: '%s'", err);
    CHECK(access(streamed, F_OK) != 0, "a short stream left %s behind", streamed);
    remove(whole);
}

// Raw elements (FP8 codes, F32 floats) and converted values in one stream, as the --ckpt-dtype
// fp8 model files are written: the bytes stw_finish writes from stw_add for the same tensors.
static void test_streaming_raw_elements(void) {
    char whole[256], streamed[256], err[512] = "";
    temp_path(whole, sizeof whole, "raw_whole");
    temp_path(streamed, sizeof streamed, "raw_streamed");
    enum { C = 300, S = 3 };
    uint8_t codes[C];
    float scales[S] = {0.5f, 1e-4f, 3.0f};
    real values[2] = {1.5, -2.25};
    for (int i = 0; i < C; i++) codes[i] = (uint8_t)(i * 7);
    const int64_t shape_c[2] = {3, 100}, shape_s[2] = {1, S}, shape_v[1] = {2};
    StWriter w;
    stw_init(&w);
    stw_add(&w, "w", ST_F8_E4M3, 2, shape_c, codes);
    stw_add(&w, "w_scale_inv", ST_F32, 2, shape_s, scales);
    stw_add_real_view(&w, "norm", ST_BF16, 1, shape_v, values);
    CHECK(stw_finish(&w, whole, err, sizeof err) == 0, "finish: %s", err);
    stw_init(&w);
    stw_declare(&w, "w", ST_F8_E4M3, 2, shape_c);
    stw_declare(&w, "w_scale_inv", ST_F32, 2, shape_s);
    stw_declare(&w, "norm", ST_BF16, 1, shape_v);
    CHECK(stw_stream_open(&w, streamed, err, sizeof err) == 0, "stream open: %s", err);
    stw_stream_raw(&w, codes, 120);
    stw_stream_raw(&w, codes + 120, C - 120);
    stw_stream_raw(&w, scales, S);
    stw_stream_values(&w, values, 2);
    CHECK(stw_stream_close(&w, err, sizeof err) == 0, "stream close: %s", err);
    size_t n_whole = 0, n_streamed = 0;
    uint8_t *a = read_all(whole, &n_whole), *b = read_all(streamed, &n_streamed);
    CHECK(a && b && n_whole > 0 && n_whole == n_streamed && memcmp(a, b, n_whole) == 0,
          "streamed file differs (%zu vs %zu bytes)", n_streamed, n_whole);
    free(a);
    free(b);
    remove(whole);
    remove(streamed);
}

int main(void) {
    RUN(test_dtypes);
    RUN(test_round_trip_all_dtypes);
    RUN(test_find_among_many);
    RUN(test_empty_file_with_only_metadata);
    RUN(test_writer_errors);
    RUN(test_streaming_writer_matches_finish);
    RUN(test_streaming_raw_elements);
    RUN(test_rejects_bad_framing);
    RUN(test_rejects_bad_headers);
    RUN(test_rejects_bad_layout);
    RUN(test_rejects_bad_metadata);
    RUN(test_huge_dimensions);
    RUN(test_truncation_at_every_offset);
    RUN(test_random_byte_flips);
    TESTS_DONE();
}
