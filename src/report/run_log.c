// run_log.c — see run_log.h.
#include "report/run_log.h"

#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"

// What a reader holds while going through the lines; reader_close releases it, once (before a
// fatal error too, so that nothing is left allocated).
typedef struct {
    RunLog *log;
    FILE *fp;
    char *text;         // the line being read, and its buffer's size
    size_t text_cap;
    JsonValue *record;  // the line parsed
    long line;          // 1-based number of the line being read
    int *hint;          // [hints] series index of the key at each position of the last record
    size_t hints;
    double *values;     // scratch for one array's numbers
    size_t values_cap;
    char error[512];    // why the line is refused ("" while none is)
} Reader;

static void reader_close(Reader *r) {
    if (r->fp) fclose(r->fp);
    json_free(r->record);
    free(r->text);
    free(r->hint);
    free(r->values);
}

// Ends the command with r->error (the file's path and the line are in it).
__attribute__((noreturn)) static void reader_fail(Reader *r) {
    reader_close(r);
    run_log_free(r->log);
    mt_die("%s", r->error);
}

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
// hint (records repeat their keys in the same order), else searched, else created. NULL with
// r->error when the key had another number of values before.
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
    if (s->is_array == is_array && s->bins.dims == dims) return s;
    snprintf(r->error, sizeof(r->error),
             "%s line %ld: \"%s\" has %d value%s where earlier records have %d; the file mixes runs of different "
             "models: give each run its own --log-jsonl file",
             log->path, r->line, key, dims, dims == 1 ? "" : "s", s->bins.dims);
    return NULL;
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
// other values (switches such as "skipped", strings) are not plotted. 0 with r->error when
// refused.
static int add_record(Reader *r, const JsonValue *record, double step) {
    for (size_t i = 0; i < record->count; i++) {
        const char *key = record->keys[i];
        const JsonValue *v = &record->items[i];
        LogSeries *s = NULL;
        if (!strcmp(key, "step")) continue;
        if (v->type == JSON_NUMBER || v->type == JSON_NULL) {
            if (!(s = series_for(r, i, key, 1, 0))) return 0;
            note_scalar(s, step, v->type == JSON_NUMBER ? v->number : NAN);
        } else if (v->type == JSON_ARRAY && read_numbers(r, v)) {
            if (!(s = series_for(r, i, key, (int)v->count, 1))) return 0;
            binned_add(&s->bins, step, r->values);
        }
    }
    return 1;
}

// The parsed line r->record into the log; 0 with r->error when refused.
static int add_line(Reader *r) {
    RunLog *log = r->log;
    const JsonValue *record = r->record;
    int64_t step;
    if (record->type != JSON_OBJECT || !json_get_int64(record, "step", &step)) {
        snprintf(r->error, sizeof(r->error),
                 "%s line %ld: a record without an integer \"step\"; give the file --log-jsonl wrote", log->path,
                 r->line);
        return 0;
    }
    if (json_get(record, "eval_loss")) {
        log->eval_records++;
    } else {
        if (!log->step_records) log->first_step = step;
        log->last_step = step;
        log->step_records++;
    }
    return add_record(r, record, (double)step);
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
    Reader r = {.log = log};
    r.fp = open_input_stream(path, INFILE_LOG, &size, err, sizeof(err));
    if (!r.fp) {
        snprintf(r.error, sizeof(r.error), "%s: %s; give the --log-jsonl file of a run, or the directory holding it",
                 path, err);
        reader_fail(&r);
    }
    ssize_t len;
    while ((len = getline(&r.text, &r.text_cap, r.fp)) > 0) {
        r.line++;
        if (blank(r.text, (size_t)len)) continue;
        int whole = r.text[len - 1] == '\n';
        r.record = json_parse(r.text, (size_t)len - (size_t)whole, err, sizeof(err));
        if (!r.record && !whole) {  // the last line, which a running trainer is still writing
            log->cut_short = 1;
            break;
        }
        if (!r.record)
            snprintf(r.error, sizeof(r.error), "%s line %ld: not a JSON record (%s); delete or repair that line", path,
                     r.line, column_of(err));
        if (!r.record || !add_line(&r)) reader_fail(&r);
        json_free(r.record);
        r.record = NULL;
    }
    if (ferror(r.fp)) {
        snprintf(r.error, sizeof(r.error), "%s: read error after line %ld", path, r.line);
        reader_fail(&r);
    }
    reader_close(&r);
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
