// fuzz_safetensors.c — st_open (src/core/safetensors.c) on a file of arbitrary bytes, then
// every lookup and every tensor read: st_find by each name, st_meta by each key, st_data,
// and st_read_real of each floating-point tensor. Checks that every tensor's bytes lie
// inside the file and match its shape and dtype.
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "fuzz.h"

typedef struct {
    const uint8_t *data;
    size_t size;
} Input;

static void body(void *ctx) {
    const Input *in = ctx;
    const char *path = fuzz_write("model.safetensors", in->data, in->size);
    StFile f;
    char err[512];
    if (st_open(&f, path, err, sizeof err)) {
        if (!err[0]) fuzz_fail("st_open failed without a message");
        if (f.bytes || f.tensors || f.n_tensors) fuzz_fail("st_open failed but left the StFile filled");
        st_close(&f);
        return;
    }
    for (int i = 0; i < f.n_meta; i++)
        if (st_meta(&f, f.meta_keys[i]) != f.meta_values[i]) fuzz_fail("st_meta does not find key %d", i);
    for (int i = 0; i < f.n_tensors; i++) {
        const StTensor *t = &f.tensors[i];
        if (st_find(&f, t->name) != t) fuzz_fail("st_find does not find tensor %d", i);
        if (t->begin > t->end || f.data_start + t->end > f.size) fuzz_fail("tensor %d lies outside the file", i);
        int64_t numel = st_numel(t);
        if (numel < 0 || (uint64_t)numel * st_dtype_size(t->dtype) != t->end - t->begin)
            fuzz_fail("tensor %d: %lld elements do not fill its %llu bytes", i, (long long)numel,
                      (unsigned long long)(t->end - t->begin));
        const uint8_t *bytes = st_data(&f, t);
        volatile uint8_t sum = 0;
        for (uint64_t k = 0; k < t->end - t->begin; k++) sum += bytes[k];
        real *out = malloc((size_t)(numel ? numel : 1) * sizeof(real));
        st_read_real(&f, t, out);
        free(out);
    }
    st_find(&f, "");
    st_find(&f, "model.embed_tokens.weight");
    st_close(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in = {data, size};
    fuzz_run(body, &in);
    return 0;
}
