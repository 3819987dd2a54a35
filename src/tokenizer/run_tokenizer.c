#include "tokenizer/run_tokenizer.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"
#include "tokenizer/tokenizer_type.h"

const char *const tokenizer_companion_files[TOKENIZER_COMPANION_COUNT] = {
    [COMPANION_TOKENIZER_CONFIG] = "tokenizer_config.json", [COMPANION_SPECIAL_TOKENS_MAP] = "special_tokens_map.json",
    [COMPANION_GENERATION_CONFIG] = "generation_config.json"};

// The companions present in the tokenizer's directory.
static void read_companions(RunTokenizer *rt) {
    const char *slash = strrchr(rt->path, '/');
    int dir_len = slash ? (int)(slash - rt->path) : 1;
    const char *dir = slash ? rt->path : ".";
    char path[MT_PATH_MAX + 64], err[512];
    for (int i = 0; i < TOKENIZER_COMPANION_COUNT; i++) {
        snprintf(path, sizeof(path), "%.*s/%s", dir_len, dir, tokenizer_companion_files[i]);
        struct stat s;
        if (stat(path, &s)) continue;
        FileBytes *f = &rt->companions[i];
        f->bytes = read_file_all(path, INFILE_CONFIG, &f->len, err, sizeof(err));
        if (!f->bytes) mt_die("%s (beside the tokenizer %s): cannot read it: %s", path, rt->path, err);
    }
}

RunTokenizer *run_tokenizer_open(Config *c) {
    if (!config_has_tokenizer(c)) return NULL;
    RunTokenizer *rt = mt_calloc(1, sizeof(*rt));
    TokenizerFile file;
    rt->tok = tokenizer_open_config(c, &file);
    snprintf(rt->path, sizeof(rt->path), "%s", file.bytes ? file.path : "NullTokenizer");
    rt->json = (FileBytes){file.bytes, file.len};
    rt->file_name = file.name;
    if (file.bytes && tokenizer_type_of(c) != TOKENIZER_TYPE_GPT2BPE) read_companions(rt);
    rt->n_end_ids = tokenizer_end_of_text_ids(rt->tok, rt->end_ids);
    rt->eos_id = rt->n_end_ids ? rt->end_ids[0] : -1;
    rt->bos_id = tokenizer_bos_id(rt->tok) >= 0 ? tokenizer_bos_id(rt->tok) : rt->eos_id;
    c->run_tokenizer = rt;
    if (!c->load[0] && !config_flag_given(c, "vocab-size")) {
        c->vocab_size = tokenizer_vocab_size(rt->tok);
        config_validate(c);
    }
    return rt;
}

void run_tokenizer_free(RunTokenizer *rt) {
    if (!rt) return;
    tokenizer_free(rt->tok);
    free(rt->json.bytes);
    for (int i = 0; i < TOKENIZER_COMPANION_COUNT; i++) free(rt->companions[i].bytes);
    free(rt);
}
