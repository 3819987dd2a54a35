# tests/fuzz/fuzz.mk — included by the Makefile. The fuzz targets tests/fuzz/fuzz_<name>.c
# (docs/testing.md, "Fuzzing"):
#   make fuzz [FUZZ_SECONDS=60] [FUZZ_JOBS=1] [FUZZ_TARGETS="json args"]
#       builds every target with clang -fsanitize=fuzzer,address,undefined into build-fuzz/
#       (the library compiled again with clang there) and runs each for FUZZ_SECONDS on
#       tests/fuzz/corpus/<name>/; crashing inputs go to tests/fuzz/regressions/<name>/
#   make test   replays both directories through $(BUILD)/fuzz/replay_<name> (normal build)
FUZZ_TARGETS ?= $(sort $(patsubst tests/fuzz/fuzz_%.c,%,$(filter-out tests/fuzz/fuzz_common.c,$(wildcard tests/fuzz/fuzz_*.c))))
FUZZ_REPLAY  := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/replay_%)
FUZZ_SHARED  := tests/fuzz/fuzz_common.c tests/fuzz/fuzz.h

# Replay drivers: the normal compiler and flags (ASan+UBSan under SANITIZE=1), no libFuzzer.
$(BUILD)/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay_main.c $(FUZZ_SHARED) $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/fuzz -DFUZZ_NAME=\"$*\" $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_JOBS    ?= 1
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -pthread -O1 -g -fno-omit-frame-pointer -Isrc -Itests/fuzz \
                -fsanitize=address,undefined -fno-sanitize-recover=all -Wno-unknown-pragmas
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_BUILD)/obj/%.o)
# kept (make would delete them as intermediates of the pattern rules after a first build)
.SECONDARY: $(FUZZ_LIB_OBJ)

ifneq ($(filter fuzz fuzz-build,$(MAKECMDGOALS)),)
HAVE_LIBFUZZER := $(shell echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' | \
                    $(FUZZ_CC) -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null && echo 1)
ifneq ($(HAVE_LIBFUZZER),1)
$(error make fuzz needs clang with libFuzzer, and $(FUZZ_CC) -fsanitize=fuzzer does not link: apt-get install clang libclang-rt-14-dev (or the libclang-rt-N-dev of your clang-N, with FUZZ_CC=clang-N))
endif
endif
FUZZ_BIN     := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_SHARED) $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $(filter %.c %.o,$^) -lm

.PHONY: fuzz fuzz-build
fuzz-build: $(FUZZ_BIN)
fuzz: $(FUZZ_BIN)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) bash tests/fuzz/run_fuzz.sh $(FUZZ_BUILD) $(FUZZ_TARGETS)

-include $(shell find $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
