// routing_trace.c — the per-rank JSONL files of routing_trace.h. Line 1 is a header
// naming the layout; each further line one record:
//   {"iteration":I,"sample":S,"layer":L,"tokens":N,"topk":[[e,...],...]}
#include "moe/routing_trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"
#include "parallel/comm.h"

#define TRACE_FORMAT 1

typedef struct {
    int64_t sample;
    int layer, tokens;
    int32_t *picks;  // (tokens, k)
} TraceRecord;

struct RoutingTrace {
    char path[MT_PATH_MAX + 32];  // this rank's file
    int replay, experts, topk;
    const Config *cfg;            // the run's (outlives the trace)
    FILE *out;                    // recording: made by the first record
    TraceRecord *records;         // replay: every record of the file
    size_t n_records;
};

// The layout a trace belongs to: the parallel sizes and the router's shape.
static void write_header(FILE *f, const Config *c, int experts, int topk) {
    fprintf(f,
            "{\"moetron_routing_trace\":%d,\"world_size\":%d,\"rank\":%d,\"tensor_model_parallel_size\":%d,"
            "\"pipeline_model_parallel_size\":%d,\"context_parallel_size\":%d,\"expert_model_parallel_size\":%d,"
            "\"sequence_parallel\":%d,\"experts\":%d,\"topk\":%d}\n",
            TRACE_FORMAT, comm_world_size(), comm_world_rank(), c->tensor_model_parallel_size,
            c->pipeline_model_parallel_size, c->context_parallel_size, c->expert_model_parallel_size,
            c->sequence_parallel, experts, topk);
}

// One header key, which must equal `want`.
static void check_header_value(const RoutingTrace *t, const JsonValue *h, const char *key, int64_t want) {
    int64_t v;
    if (!json_get_int64(h, key, &v))
        mt_die("%s: the header has no \"%s\"; it is not a moetron routing trace", t->path, key);
    if (v != want)
        mt_die("%s: recorded with %s %lld, this run has %lld; replay with the recording run's layout and model",
               t->path, key, (long long)v, (long long)want);
}

static void check_header(const RoutingTrace *t, const JsonValue *h, const Config *c) {
    check_header_value(t, h, "moetron_routing_trace", TRACE_FORMAT);
    check_header_value(t, h, "world_size", comm_world_size());
    check_header_value(t, h, "rank", comm_world_rank());
    check_header_value(t, h, "tensor_model_parallel_size", c->tensor_model_parallel_size);
    check_header_value(t, h, "pipeline_model_parallel_size", c->pipeline_model_parallel_size);
    check_header_value(t, h, "context_parallel_size", c->context_parallel_size);
    check_header_value(t, h, "expert_model_parallel_size", c->expert_model_parallel_size);
    check_header_value(t, h, "sequence_parallel", c->sequence_parallel);
    check_header_value(t, h, "experts", t->experts);
    check_header_value(t, h, "topk", t->topk);
}

// The record on line `line` (1-based), its picks checked: k distinct experts per token.
static TraceRecord parse_record(const RoutingTrace *t, const JsonValue *v, long line) {
    TraceRecord r;
    int64_t layer, tokens;
    const JsonValue *topk = json_get(v, "topk");
    if (!json_get_int64(v, "sample", &r.sample) || !json_get_int64(v, "layer", &layer) ||
        !json_get_int64(v, "tokens", &tokens) || !topk || topk->type != JSON_ARRAY || tokens < 0 ||
        (int64_t)topk->count != tokens || layer < 0 || layer > MT_MAX_LAYERS)
        mt_die("%s:%ld: not a routing record (sample, layer, tokens and a topk list of tokens rows)", t->path, line);
    r.layer = (int)layer;
    r.tokens = (int)tokens;
    r.picks = mt_malloc((size_t)(tokens ? tokens : 1) * t->topk * sizeof(int32_t));
    for (int64_t n = 0; n < tokens; n++) {
        const JsonValue *row = json_at(topk, (size_t)n);
        if (row->type != JSON_ARRAY || (int)row->count != t->topk)
            mt_die("%s:%ld: token %lld has no list of %d experts", t->path, line, (long long)n, t->topk);
        for (int j = 0; j < t->topk; j++) {
            int64_t e;
            int32_t *pick = &r.picks[n * t->topk + j];
            if (!json_as_int64(json_at(row, (size_t)j), &e) || e < 0 || e >= t->experts)
                mt_die("%s:%ld: token %lld names an expert outside 0..%d", t->path, line, (long long)n, t->experts - 1);
            *pick = (int32_t)e;
            for (int i = 0; i < j; i++)
                if (r.picks[n * t->topk + i] == *pick)
                    mt_die("%s:%ld: token %lld names expert %lld twice", t->path, line, (long long)n, (long long)e);
        }
    }
    return r;
}

// Records in (sample, layer) order, for the lookups of replay.
static int compare_records(const void *a, const void *b) {
    const TraceRecord *x = a, *y = b;
    if (x->sample != y->sample) return x->sample < y->sample ? -1 : 1;
    return (x->layer > y->layer) - (x->layer < y->layer);
}

// Replay: every line of this rank's file, the header checked against this run.
static void read_trace(RoutingTrace *t, const Config *c) {
    char err[512];
    uint64_t size;
    FILE *f = open_input_stream(t->path, INFILE_DATA, &size, err, sizeof err);
    if (!f)
        mt_die("--moe-enable-routing-replay: %s: %s (record it first with --moe-routing-trace-path)", t->path, err);
    char *text = NULL;
    size_t cap = 0;
    ssize_t len;
    size_t records_cap = 0;
    for (long line = 1; (len = getline(&text, &cap, f)) > 0; line++) {
        JsonValue *v = json_parse(text, (size_t)len, err, sizeof err);
        if (!v || v->type != JSON_OBJECT) mt_die("%s:%ld: not a JSON object (%s)", t->path, line, v ? "" : err);
        if (line == 1) {
            check_header(t, v, c);
        } else {
            if (t->n_records == records_cap) {
                records_cap = records_cap ? 2 * records_cap : 64;
                t->records = mt_realloc(t->records, records_cap * sizeof(TraceRecord));
            }
            t->records[t->n_records++] = parse_record(t, v, line);
        }
        json_free(v);
    }
    free(text);
    fclose(f);
    qsort(t->records, t->n_records, sizeof(TraceRecord), compare_records);
    for (size_t i = 1; i < t->n_records; i++)
        if (!compare_records(&t->records[i - 1], &t->records[i]))
            mt_die("%s: two records of sample %lld, layer %d; the file is damaged", t->path,
                   (long long)t->records[i].sample, t->records[i].layer);
}

// Recording: the file must not exist yet; it (and its directory) is made by the first
// record, so that a run refused at start-up leaves nothing behind.
static void check_new_trace(const RoutingTrace *t) {
    struct stat st;
    if (stat(t->path, &st) == 0)
        mt_die("--moe-routing-trace-path: %s exists; give a new directory (a trace is never overwritten) or replay it "
               "with --moe-enable-routing-replay", t->path);
}

static void create_trace(RoutingTrace *t) {
    const Config *c = t->cfg;
    if (make_directories(c->moe_routing_trace_path) != 0)
        mt_die("--moe-routing-trace-path %s: cannot create the directory (%s)", c->moe_routing_trace_path,
               strerror(errno));
    check_new_trace(t);
    t->out = fopen(t->path, "w");
    if (!t->out) mt_die("--moe-routing-trace-path: cannot create %s (%s)", t->path, strerror(errno));
    write_header(t->out, c, t->experts, t->topk);
}

RoutingTrace *routing_trace_open(const Config *c, int experts, int topk) {
    if (!c->moe_routing_trace_path[0]) return NULL;
    RoutingTrace *t = mt_calloc(1, sizeof(RoutingTrace));
    snprintf(t->path, sizeof t->path, "%s/rank_%05d.jsonl", c->moe_routing_trace_path, comm_world_rank());
    t->replay = c->moe_enable_routing_replay;
    t->experts = experts;
    t->topk = topk;
    t->cfg = c;
    if (t->replay) read_trace(t, c);
    else check_new_trace(t);
    return t;
}

void routing_trace_close(RoutingTrace *t) {
    if (!t) return;
    if (t->out && fclose(t->out) != 0) mt_die("--moe-routing-trace-path: writing %s failed", t->path);
    for (size_t i = 0; i < t->n_records; i++) free(t->records[i].picks);
    free(t->records);
    free(t);
}

int routing_trace_replays(const RoutingTrace *t) { return t && t->replay; }

void routing_trace_write(RoutingTrace *t, long iteration, int64_t first_sample, int layer, const int32_t *picks,
                         int N) {
    if (!t->out) create_trace(t);
    FILE *f = t->out;
    fprintf(f, "{\"iteration\":%ld,\"sample\":%lld,\"layer\":%d,\"tokens\":%d,\"topk\":[", iteration,
            (long long)first_sample, layer, N);
    for (int n = 0; n < N; n++) {
        fputs(n ? ",[" : "[", f);
        for (int j = 0; j < t->topk; j++) fprintf(f, j ? ",%d" : "%d", picks[(size_t)n * t->topk + j]);
        fputc(']', f);
    }
    fputs("]}\n", f);
    if (fflush(f) != 0) mt_die("--moe-routing-trace-path: writing %s failed (%s)", t->path, strerror(errno));
}

const int32_t *routing_trace_replay(const RoutingTrace *t, int64_t first_sample, int layer, int N) {
    TraceRecord key = {.sample = first_sample, .layer = layer};
    const TraceRecord *r = bsearch(&key, t->records, t->n_records, sizeof(TraceRecord), compare_records);
    if (r) {
        if (r->tokens != N)
            mt_die("%s: the record of sample %lld, layer %d holds %d tokens, this run routes %d there; replay with the "
                   "recording run's flags", t->path, (long long)first_sample, layer, r->tokens, N);
        return r->picks;
    }
    mt_die("%s: no record of sample %lld, layer %d; replay only the steps the recording run trained", t->path,
           (long long)first_sample, layer);
}
