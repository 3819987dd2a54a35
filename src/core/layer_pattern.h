// layer_pattern.h — Megatron-LM's --moe-layer-freq list expressions: "[0,1,1,1]",
// "[0]*3+[1]*58", "([1]*3+[0])*2" (Python list literals of 0 and 1, joined by + and
// repeated by * N, in parentheses as needed), expanded into one 0/1 value per layer.
#pragma once
#include <stddef.h>

// Expands text into out[0..cap). Returns the number of values; -1 on a malformed
// expression or more than cap values, with the reason (one phrase) in err.
int layer_pattern_expand(const char *text, int *out, int cap, char *err, size_t err_cap);
