// run_log.c — see run_log.h.
#include "report/run_log.h"

#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"

// What a reader keeps while going through the lines.
typedef struct {
    RunLog *log;
    long line;          // 1-based number of the line being read
    int *hint;          // [hints] series index of the key at each position of the last record
    size_t hints;
    double *values;     // scratch for one array's numbers
    size_t values_cap;
} Reader;

static LogSeries *add_series(RunLog *log, const char *key, int dims, int is_array) {
    if (log->count == log->capacity) {
        log->capacity = log->capacity ? 2 * log->capacity : 32;
        log->series = mt_realloc(log->series, (size_t)log->capacity * sizeof(LogSeries));
    }
    LogSeries *s = &log->series[log->count++];
    memset(s, 0, sizeof(*s));
    s->key = mt_strdup(key);
    s->is_array = is_array;
    binned_init(&s->bins, dims, is_array ? RUN_LOG_ARRAY_COLUMNS : RUN_LOG_LINE_COLUMNS);
    s->first = s->last = s->last_step = s->max = s->max_step = NAN;
    return s;
}

// The series of the record's item at `position` named key: found through the position's
// hint (records repeat their keys in the same order), else searched, else created.
static LogSeries *series_for(Reader *r, size_t position, const char *key, int dims, int is_array) {
    RunLog *log = r->log;
    if (position >= r->hints) {
        size_t grown = MT_MAX(2 * r->hints, position + 1);
        r->hint = mt_realloc(r->hint, grown * sizeof(int));
        for (size_t i = r->hints; i < grown; i++) r->hint[i] = -1;
        r->hints = grown;
    }
    int at = r->hint[position];
    if (at < 0 || strcmp(log->series[at].key, key) != 0) {
        const LogSeries *known = run_log_find(log, key);
        at = known ? (int)(known - log->series) : (add_series(log, key, dims, is_array), log->count - 1);
        r->hint[position] = at;
    }
    LogSeries *s = &log->series[at];
    if (s->is_array != is_array || s->bins.dims != dims)
        mt_die("%s line %ld: \"%s\" has %d value%s where earlier records have %d; the file mixes runs of different "
               "models: give each run its own --log-jsonl file",
               log->path, r->line, key, dims, dims == 1 ? "" : "s", s->bins.dims);
    return s;
}

static void note_scalar(LogSeries *s, double step, double value) {
    binned_add(&s->bins, step, &value);
    if (!isfinite(value)) return;
    if (!s->finite) s->first = value;
    if (!s->finite || value > s->max) s->max = value, s->max_step = step;
    s->last = value;
    s->last_step = step;
    s->sum += value;
    s->finite++;
}

// An array of numbers (null counts as a missing value): its values in r->values; 0 when an
// item is neither.
static int read_numbers(Reader *r, const JsonValue *array) {
    if (array->count == 0) return 0;
    if (array->count > r->values_cap) {
        r->values_cap = array->count;
        r->values = mt_realloc(r->values, r->values_cap * sizeof(double));
    }
    for (size_t i = 0; i < array->count; i++) {
        const JsonValue *v = &array->items[i];
        if (v->type == JSON_NUMBER) r->values[i] = v->number;
        else if (v->type == JSON_NULL) r->values[i] = NAN;
        else return 0;
    }
    return 1;
}

// Every numeric key of one record (numbers, null for a non-finite value, arrays of numbers);
// other values (switches such as "skipped", strings) are not plotted.
static void add_record(Reader *r, const JsonValue *record, double step) {
    for (size_t i = 0; i < record->count; i++) {
        const char *key = record->keys[i];
        const JsonValue *v = &record->items[i];
        if (!strcmp(key, "step")) continue;
        if (v->type == JSON_NUMBER || v->type == JSON_NULL) {
            note_scalar(series_for(r, i, key, 1, 0), step, v->type == JSON_NUMBER ? v->number : NAN);
        } else if (v->type == JSON_ARRAY && read_numbers(r, v)) {
            LogSeries *s = series_for(r, i, key, (int)v->count, 1);
            binned_add(&s->bins, step, r->values);
        }
    }
}

static void add_line(Reader *r, const JsonValue *record) {
    RunLog *log = r->log;
    int64_t step;
    if (record->type != JSON_OBJECT || !json_get_int64(record, "step", &step))
        mt_die("%s line %ld: a record without an integer \"step\"; give the file --log-jsonl wrote", log->path,
               r->line);
    if (json_get(record, "eval_loss")) {
        log->eval_records++;
    } else {
        if (!log->step_records) log->first_step = step;
        log->last_step = step;
        log->step_records++;
    }
    add_record(r, record, (double)step);
}

static int blank(const char *text, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\r' && text[i] != '\n') return 0;
    return 1;
}

// The parser's "line 1 column C: what" of a one-line record, without its "line 1".
static const char *column_of(const char *err) {
    static const char ONE_LINE[] = "line 1 ";
    return strncmp(err, ONE_LINE, sizeof(ONE_LINE) - 1) ? err : err + sizeof(ONE_LINE) - 1;
}

void run_log_read(RunLog *log, const char *path) {
    memset(log, 0, sizeof(*log));
    log->path = mt_strdup(path);
    char err[256];
    uint64_t size;
    FILE *fp = open_input_stream(path, INFILE_LOG, &size, err, sizeof(err));
    if (!fp) mt_die("%s: %s; give the --log-jsonl file of a run, or the directory holding it", path, err);
    Reader r = {.log = log};
    char *text = NULL;
    size_t text_cap = 0;
    ssize_t len;
    while ((len = getline(&text, &text_cap, fp)) > 0) {
        r.line++;
        if (blank(text, (size_t)len)) continue;
        int whole = text[len - 1] == '\n';
        JsonValue *record = json_parse(text, (size_t)len - (size_t)whole, err, sizeof(err));
        if (!record && !whole) {  // the last line, which a running trainer is still writing
            log->cut_short = 1;
            break;
        }
        if (!record)
            mt_die("%s line %ld: not a JSON record (%s); delete or repair that line", path, r.line, column_of(err));
        add_line(&r, record);
        json_free(record);
    }
    int read_error = ferror(fp);
    fclose(fp);
    free(text);
    free(r.hint);
    free(r.values);
    if (read_error) mt_die("%s: read error after line %ld", path, r.line);
}

void run_log_free(RunLog *log) {
    for (int i = 0; i < log->count; i++) {
        free(log->series[i].key);
        binned_free(&log->series[i].bins);
    }
    free(log->series);
    free(log->path);
    memset(log, 0, sizeof(*log));
}

const LogSeries *run_log_find(const RunLog *log, const char *key) {
    for (int i = 0; i < log->count; i++)
        if (!strcmp(log->series[i].key, key)) return &log->series[i];
    return NULL;
}
