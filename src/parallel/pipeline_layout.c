#include "parallel/pipeline_layout.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"

static int refuse(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return 1;
}

// ---- the layout string ---------------------------------------------------------------

// Appends `len` characters of s `times` times to out (capacity cap); 0 when it overflows.
static int append_repeated(char *out, size_t *at, size_t cap, const char *s, size_t len, long times) {
    for (long i = 0; i < times; i++) {
        if (*at + len >= cap) return 0;
        memcpy(out + *at, s, len);
        *at += len;
    }
    out[*at] = 0;
    return 1;
}

// A repeat count "*n" at s: its value and length, or 0 when there is none.
static size_t repeat_count(const char *s, long *times) {
    if (s[0] != '*' || !isdigit((unsigned char)s[1])) return 0;
    char *end;
    *times = strtol(s + 1, &end, 10);
    return (size_t)(end - s);
}

// One unrolling pass, left to right: "(xyz)*n" when groups, else "x*n", becomes n copies.
static int unroll(const char *in, char *out, size_t cap, int groups) {
    size_t at = 0;
    out[0] = 0;
    for (const char *s = in; *s;) {
        const char *body = s, *close = s + 1;
        size_t len = 1;
        if (groups) {
            close = *s == '(' ? strchr(s + 1, ')') : NULL;
            body = s + 1, len = close ? (size_t)(close - body) : 0;
            close = close ? close + 1 : NULL;
        }
        long times;
        size_t count = close && len ? repeat_count(close, &times) : 0;
        if (count) {
            if (!append_repeated(out, &at, cap, body, len, times)) return 0;
            s = close + count;
        } else {
            if (!append_repeated(out, &at, cap, s, 1, 1)) return 0;
            s++;
        }
    }
    return 1;
}

// Where the multi-token-prediction layers (m) may stand: after every decoder layer, all in
// the stage of the loss (where moetron runs them, after the head), as many as --mtp-num-layers.
// mtp_outside: an m stands in another stage than the last.
static int check_mtp_placement(const char *s, int mtp_outside, const Config *c, char *err, size_t n) {
    const char *flag = "--pipeline-model-parallel-layout";
    int count = 0;
    for (const char *p = s; *p; p++) count += *p == 'm';
    if (count != c->mtp_num_layers)
        return refuse(err, n, "%s has %d multi-token-prediction layers (m) but --mtp-num-layers is %d", flag, count,
                      c->mtp_num_layers);
    const char *first = strchr(s, 'm');
    if (first && strchr(first, 't'))
        return refuse(err, n, "%s: the multi-token-prediction layers (m) come after every decoder layer (t)", flag);
    if (mtp_outside)
        return refuse(err, n, "%s: moetron runs the multi-token-prediction layers (m) in the stage of the loss (L), "
                      "after the LM head; put every m in that stage", flag);
    return 0;
}

// Counts the decoder layers of each stage of the unrolled string; E and L must be the very
// first and last entries.
static int parse_stages(PipelineLayout *pl, const char *s, const Config *c, char *err, size_t n) {
    const char *flag = "--pipeline-model-parallel-layout";
    int stage = 0, embeddings = 0, losses = 0, decoders = 0, last_mtp_stage = -1, mtp_stages = 0;
    memset(pl->layers, 0, sizeof(pl->layers));
    char last = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '|') {
            if (++stage >= PP_MAX_STAGES) return refuse(err, n, "%s has more than %d stages", flag, PP_MAX_STAGES);
            continue;
        }
        if (*p == 'm' && last_mtp_stage != stage) last_mtp_stage = stage, mtp_stages++;
        if (!strchr("EtmL", *p))
            return refuse(err, n, "%s: '%c' is not a layer (E embedding, t decoder layer, m multi-token-prediction "
                          "layer, L loss, | between stages, (..)*n or x*n to repeat)", flag, *p);
        if (*p == 'E' && (embeddings++ || p != s))
            return refuse(err, n, "%s must start with E (the embedding), once", flag);
        losses += *p == 'L';
        if (*p == 't') pl->layers[stage]++, decoders++;
        last = *p;
    }
    pl->stages = stage + 1;
    if (!embeddings) return refuse(err, n, "%s must start with E (the embedding), once", flag);
    if (losses != 1 || last != 'L') return refuse(err, n, "%s must end with L (the loss), once", flag);
    if (decoders != c->num_layers)
        return refuse(err, n, "%s has %d decoder layers (t) but --num-layers is %d", flag, decoders, c->num_layers);
    int mtp_outside = mtp_stages > 1 || (mtp_stages == 1 && last_mtp_stage != pl->stages - 1);
    if (check_mtp_placement(s, mtp_outside, c, err, n)) return 1;
    if (pl->stages % pl->pp)
        return refuse(err, n, "%s has %d stages, not a multiple of --pipeline-model-parallel-size %d", flag,
                      pl->stages, pl->pp);
    pl->vp = pl->stages / pl->pp;
    return 0;
}

static int from_layout_string(PipelineLayout *pl, const Config *c, char *err, size_t n) {
    size_t cap = 1 << 16;
    char *clean = mt_malloc(cap), *once = mt_malloc(cap), *twice = mt_malloc(cap);
    size_t at = 0;
    for (const char *p = c->pipeline_model_parallel_layout; *p && at + 1 < cap; p++)
        if (*p != ',' && !isspace((unsigned char)*p)) clean[at++] = *p;  // commas are cosmetic
    clean[at] = 0;
    int bad = !unroll(clean, once, cap, 1) || !unroll(once, twice, cap, 0)
                  ? refuse(err, n, "--pipeline-model-parallel-layout unrolls to more than %zu characters", cap)
                  : parse_stages(pl, twice, c, err, n);
    free(clean);
    free(once);
    free(twice);
    return bad;
}

// ---- the counted splits ------------------------------------------------------------------

// Layers of each rank (before the embedding's or loss's share is taken off).
static int rank_layers(const Config *c, int pp, int *per_rank, char *err, size_t n) {
    int first = c->decoder_first_pipeline_num_layers, last = c->decoder_last_pipeline_num_layers;
    if (first < 0 && last < 0) {
        int total = c->num_layers + c->account_for_embedding_in_pipeline_split + c->account_for_loss_in_pipeline_split;
        if (total % pp)
            return refuse(err, n, "--num-layers %d%s%s is not a multiple of --pipeline-model-parallel-size %d; use "
                          "--decoder-first/last-pipeline-num-layers or --pipeline-model-parallel-layout for an uneven "
                          "split", c->num_layers, c->account_for_embedding_in_pipeline_split ? " + the embedding" : "",
                          c->account_for_loss_in_pipeline_split ? " + the loss" : "", pp);
        for (int r = 0; r < pp; r++) per_rank[r] = total / pp;
        return 0;
    }
    if (c->account_for_embedding_in_pipeline_split || c->account_for_loss_in_pipeline_split)
        return refuse(err, n, "--decoder-first/last-pipeline-num-layers cannot be combined with "
                      "--account-for-embedding/loss-in-pipeline-split; use --pipeline-model-parallel-layout");
    int middle = pp - (first >= 0) - (last >= 0);
    int rest = c->num_layers - MT_MAX(first, 0) - MT_MAX(last, 0);
    if (pp == 1 || rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && rest % middle))
        return refuse(err, n, "--decoder-first/last-pipeline-num-layers (%d, %d) leave %d of --num-layers %d for %d "
                      "middle stage(s): they must split evenly (PP above 1)", first, last, rest, c->num_layers, middle);
    for (int r = 0; r < pp; r++) per_rank[r] = middle ? rest / middle : 0;
    if (first >= 0) per_rank[0] = first;
    if (last >= 0) per_rank[pp - 1] = last;
    return 0;
}

// v from --num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank.
static int virtual_stages(const Config *c, int per_rank0, int uneven, int *vp, char *err, size_t n) {
    *vp = 1;
    if (c->num_virtual_stages_per_pipeline_rank > 0) *vp = c->num_virtual_stages_per_pipeline_rank;
    if (c->num_layers_per_virtual_pipeline_stage > 0) {
        if (uneven)
            return refuse(err, n, "with --decoder-first/last-pipeline-num-layers give the virtual stages as "
                          "--num-virtual-stages-per-pipeline-rank, not --num-layers-per-virtual-pipeline-stage");
        if (per_rank0 % c->num_layers_per_virtual_pipeline_stage)
            return refuse(err, n, "--num-layers-per-virtual-pipeline-stage %d does not divide the %d layers of each "
                          "pipeline rank", c->num_layers_per_virtual_pipeline_stage, per_rank0);
        *vp = per_rank0 / c->num_layers_per_virtual_pipeline_stage;
    }
    return 0;
}

static int from_counts(PipelineLayout *pl, const Config *c, char *err, size_t n) {
    int pp = pl->pp, *per_rank = mt_calloc((size_t)pp, sizeof(int)), bad;
    int uneven = c->decoder_first_pipeline_num_layers >= 0 || c->decoder_last_pipeline_num_layers >= 0;
    bad = rank_layers(c, pp, per_rank, err, n) || virtual_stages(c, per_rank[0], uneven, &pl->vp, err, n);
    pl->stages = pp * pl->vp;
    if (!bad && pl->stages > PP_MAX_STAGES) bad = refuse(err, n, "more than %d pipeline stages", PP_MAX_STAGES);
    for (int r = 0; r < pp && !bad; r++) {
        if (per_rank[r] % pl->vp) {
            bad = refuse(err, n, "pipeline rank %d has %d layers, not a multiple of its %d virtual stages", r,
                         per_rank[r], pl->vp);
            break;
        }
        for (int v = 0; v < pl->vp; v++) pl->layers[v * pp + r] = per_rank[r] / pl->vp;
    }
    free(per_rank);
    if (bad) return 1;
    if (c->account_for_embedding_in_pipeline_split && --pl->layers[0] < 0)
        return refuse(err, n, "--account-for-embedding-in-pipeline-split leaves the first stage with no layer to "
                      "give up; use fewer stages");
    if (c->account_for_loss_in_pipeline_split && --pl->layers[pl->stages - 1] < 0)
        return refuse(err, n, "--account-for-loss-in-pipeline-split leaves the last stage with no layer to give up; "
                      "use fewer stages");
    return 0;
}

int pipeline_layout_make(PipelineLayout *pl, const Config *c, char *err, size_t err_size) {
    memset(pl, 0, sizeof(*pl));
    pl->pp = c->pipeline_model_parallel_size;
    int vp_flags = (c->num_layers_per_virtual_pipeline_stage > 0) + (c->num_virtual_stages_per_pipeline_rank > 0) +
                   (c->pipeline_model_parallel_layout[0] != 0);
    if (vp_flags > 1)
        return refuse(err, err_size, "give at most one of --num-layers-per-virtual-pipeline-stage, "
                      "--num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout");
    int counted = c->decoder_first_pipeline_num_layers >= 0 || c->decoder_last_pipeline_num_layers >= 0 ||
                  c->account_for_embedding_in_pipeline_split || c->account_for_loss_in_pipeline_split;
    if (c->pipeline_model_parallel_layout[0] && counted)
        return refuse(err, err_size, "--pipeline-model-parallel-layout places every layer itself; drop "
                      "--decoder-first/last-pipeline-num-layers and --account-for-embedding/loss-in-pipeline-split");
    int bad = c->pipeline_model_parallel_layout[0] ? from_layout_string(pl, c, err, err_size)
                                                   : from_counts(pl, c, err, err_size);
    if (bad) return 1;
    if (pl->vp > 1 && pl->pp == 1)
        return refuse(err, err_size, "virtual pipeline stages (%d per rank) need --pipeline-model-parallel-size above 1",
                      pl->vp);
    for (int s = 1; s < pl->stages; s++) pl->first_layer[s] = pl->first_layer[s - 1] + pl->layers[s - 1];
    return 0;
}
