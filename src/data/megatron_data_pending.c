// megatron_data_pending.c — TEMPORARY weak stand-ins so the tree links while megatron_data.c
// is being written in parallel; the real (strong) definitions replace them. Delete with it.
#include "core/common.h"
#include "data/megatron_data.h"

__attribute__((weak)) int megatron_data_requested(const Config *c) {
    (void)c;
    return 0;
}
__attribute__((weak)) MegatronData *megatron_data_open(const Config *c, const int64_t num_samples[3]) {
    (void)c, (void)num_samples;
    mt_die("Megatron datasets are not built into this binary yet");
}
__attribute__((weak)) void megatron_data_free(MegatronData *d) { (void)d; }
__attribute__((weak)) int64_t megatron_data_size(const MegatronData *d, DataSplit split) {
    (void)d, (void)split;
    return 0;
}
__attribute__((weak)) void megatron_data_sample(const MegatronData *d, DataSplit split, int64_t i, int32_t *tokens) {
    (void)d, (void)split, (void)i, (void)tokens;
}
