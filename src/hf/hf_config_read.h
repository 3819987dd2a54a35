// hf_config_read.h — the model shape from a plain Hugging Face config.json (no moetron
// section): mixtral, qwen3_moe, olmoe and deepseek_v3. Every key that changes the
// function is either mapped to a flag or, when moetron cannot represent its value,
// rejected with an error naming the key.
#pragma once
#include "core/config.h"
#include "core/json.h"

// Fill c's architecture flags from root (the parsed path). Architecture flags given on
// the command line are an error: the shape comes from the file.
void hf_config_read_plain(Config *c, const JsonValue *root, const char *path);
