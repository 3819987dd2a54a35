# moetron — build with whatever optional libraries this machine has.
#   make            build build/moetron
#   make run        train the default MoE model on the built-in data
#   make test       the whole test suite (ends with "N passed, M failed")
#   make bench      GEMM and training throughput on this machine
#   make fuzz       every parser's libFuzzer target for FUZZ_SECONDS (tests/fuzz/fuzz.mk)
#   make check-gpu  the cuda backend against the cpu on a GPU machine (tests/gpu/check_gpu.sh)
# Switches: NO_OPENMP=1, USE_OPENBLAS=1 (OpenBLAS for GEMM), DEBUG=1, SANITIZE=1 (ASan+UBSan),
#           NO_MPI=1 (the one-process build even where mpicc is found), NO_CUDA=1 (no cuda
#           backend even where nvcc is found), CUDA_ARCHS="80 90" (GPU architectures).

.DEFAULT_GOAL := all
CC      ?= cc
PYTHON  ?= python3
BUILD   ?= build

WARN    := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wno-sign-compare
# -g: strict memory names the line of a host access. -mprefer-vector-width=512: the vectorized
# loops (SwiGLU, norms, the loss, AdamW) in 512-bit registers where the CPU has them (GCC's
# default there is 256); the same results (no reduction is reordered), ~2% of a --bf16 step.
OPT     := -O3 -march=native -mprefer-vector-width=512 -g
ifdef DEBUG
OPT     := -O0 -g
else ifdef SANITIZE
# The sanitizers' usual level: the checks are the same, the suite runs ~3x faster than at -O0.
OPT     := -O1 -g
endif
# -fno-trapping-math and -fno-math-errno change no result: they let loops with compares,
# exponentials (core/fast_exp.h) and square roots vectorize.
CFLAGS  += -std=c11 -D_GNU_SOURCE -pthread $(OPT) $(WARN) -fno-trapping-math -fno-math-errno -MMD -MP -Isrc
LDFLAGS += -pthread
LDLIBS  += -lm

ifdef SANITIZE
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -g
LDFLAGS += -fsanitize=address,undefined
endif

# MPI (docs/parallelism.md): built with mpicc when it is found, unless NO_MPI=1 or CC is
# set by hand. src/parallel/comm_mpi.c is then compiled, comm_local.c otherwise.
MPICC   ?= mpicc
ifndef NO_MPI
ifneq ($(filter default file,$(origin CC)),)
HAVE_MPI := $(shell command -v $(MPICC) >/dev/null 2>&1 && echo 1)
endif
endif
ifeq ($(HAVE_MPI),1)
CC      := $(MPICC)
CFLAGS  += -DMT_HAVE_MPI
MPI_TEST := $(BUILD)/test_comm_mpi $(BUILD)/test_tp_mappings $(BUILD)/test_ckpt_tp_mpi $(BUILD)/test_router_group \
            $(BUILD)/test_router_group_dbl $(BUILD)/test_cp_attention $(BUILD)/test_cp_attention_dbl
endif

# OpenMP: used when the compiler has it.
ifndef NO_OPENMP
HAVE_OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo 1)
ifeq ($(HAVE_OPENMP),1)
CFLAGS  += -fopenmp
LDFLAGS += -fopenmp
endif
endif

# OpenBLAS for GEMM only when asked (USE_OPENBLAS=1): the portable GEMM is as fast on
# the machines measured (bench/RESULTS.md) and shares OpenMP's threads instead of running
# a second thread pool that competes with them.
ifdef USE_OPENBLAS
HAVE_CBLAS := $(shell $(CC) tools/probe_cblas.c -o /dev/null -lopenblas 2>/dev/null && echo 1)
ifneq ($(HAVE_CBLAS),1)
$(error USE_OPENBLAS=1 but OpenBLAS (cblas.h, -lopenblas) was not found; apt-get install libopenblas-dev)
endif
CFLAGS  += -DMT_HAVE_CBLAS
LDLIBS  += -lopenblas
endif

LIB_SRC   := $(sort $(filter-out src/main.c,$(wildcard src/*/*.c src/*/*/*.c)))

# CUDA (docs/gpu.md): the cuda backend is built when nvcc is found in CUDA_HOME, unless
# NO_CUDA=1 or SANITIZE=1 (the sanitizer build tests the cpu backend). It is a plugin,
# $(BUILD)/libmoetron_cuda.so (src/ops/cuda/*.cu by nvcc, the table in backend_cuda.c, and
# with MPI and nccl.h the NCCL data path), that src/core/device.c loads for --device cuda:
# runs on the cpu never load cuBLAS, the CUDA runtime or NCCL, so they start as fast as a
# build without CUDA. The executable exports its symbols (-rdynamic) for the plugin.
CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCHS ?= 80 90
PLUGIN_C   := src/ops/cuda/backend_cuda.c src/parallel/comm_nccl.c
LIB_SRC    := $(filter-out $(PLUGIN_C),$(LIB_SRC))
LIB_OBJ    := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
ifndef NO_CUDA
ifndef SANITIZE
HAVE_CUDA := $(shell test -x $(NVCC) && echo 1)
endif
endif
ifeq ($(HAVE_CUDA),1)
CUDA_PLUGIN := $(BUILD)/libmoetron_cuda.so
CFLAGS      += -DMT_HAVE_CUDA
LDFLAGS     += -rdynamic
PLUGIN_SRC  := $(sort $(wildcard src/*/*.cu src/*/*/*.cu)) $(wildcard $(PLUGIN_C))
PLUGIN_OBJ  := $(patsubst %,$(BUILD)/plugin/%.o,$(basename $(PLUGIN_SRC)))
PLUGIN_CFLAGS := $(CFLAGS) -fPIC -I$(CUDA_HOME)/include
PLUGIN_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
NVCCFLAGS   := -std=c++17 -O3 -Isrc -DMT_HAVE_CUDA -Xcompiler -fPIC,-fno-math-errno \
               $(foreach a,$(CUDA_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a)) \
               -gencode=arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS)) -MMD -MP
ifeq ($(HAVE_MPI),1)
ifneq ($(wildcard $(CUDA_HOME)/include/nccl.h),)
PLUGIN_CFLAGS += -DMT_HAVE_NCCL
NVCCFLAGS     += -DMT_HAVE_NCCL
PLUGIN_LIBS   += -lnccl
endif
endif
endif

$(BUILD)/plugin/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

$(BUILD)/plugin/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) -c -o $@ $<

$(CUDA_PLUGIN): $(PLUGIN_OBJ)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(PLUGIN_LIBS)

DBL_OBJ   := $(LIB_SRC:%.c=$(BUILD)/dbl/%.o)
UNIT_SRC  := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)

.PHONY: all run test unit bench clean
all: $(BUILD)/moetron $(CUDA_PLUGIN)

$(BUILD)/moetron: $(BUILD)/obj/src/main.o $(LIB_OBJ)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LDLIBS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

# The same library in double precision, for gradient checks (tests named test_grad_*).
$(BUILD)/dbl/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DMT_DOUBLE -c -o $@ $<

GRAD_BIN  := $(filter $(BUILD)/tests/test_grad_%,$(UNIT_BIN))
FLOAT_BIN := $(filter-out $(GRAD_BIN),$(UNIT_BIN))

$(GRAD_BIN): $(BUILD)/tests/%: tests/unit/%.c $(DBL_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DMT_DOUBLE $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

$(FLOAT_BIN): $(BUILD)/tests/%: tests/unit/%.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

unit: $(UNIT_BIN)

# Runs moetron's router on given logits for tests/conformance/megatron_router.py.
$(BUILD)/router_probe: tests/conformance/router_probe.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# moetron's number formats and AdamW with narrow moments, for tests/conformance/precision_optimizer.py.
$(BUILD)/moment_probe: tests/conformance/moment_probe.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# moetron's quantizers on given values, for tests/conformance/quantizers.py.
$(BUILD)/quant_probe: tests/conformance/quant_probe.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# moetron's tokenizer on a file, for tests/conformance/tokenizer_conformance.py.
$(BUILD)/tokenize_probe: tools/tokenize_probe.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# moetron's Megatron .bin/.idx reader and writer, for tests/conformance/megatron_indexed.py.
$(BUILD)/indexed_probe: tools/indexed_probe.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# The default model's lr 3e-3 needs a warmup (without one its loss rises over the first
# 20 steps, and at step 50 it is 3.18 against 2.27 with 20 warmup steps); --lr-warmup-iters
# itself defaults to 0 as in Megatron-LM.
RUN_WARMUP_ITERS := 20
run: $(BUILD)/moetron
	rm -rf $(BUILD)/run_ckpt $(BUILD)/run_metrics.jsonl
	./$(BUILD)/moetron train --lr-warmup-iters $(RUN_WARMUP_ITERS) --save $(BUILD)/run_ckpt --log-jsonl $(BUILD)/run_metrics.jsonl
	@echo "--- samples from the trained model ---"
	@./$(BUILD)/moetron generate --load $(BUILD)/run_ckpt --prompt "the small cat" --max-new-tokens 150 --temperature 0.6 --top-k 20
	@./$(BUILD)/moetron generate --load $(BUILD)/run_ckpt --prompt "12+7=" --max-new-tokens 60 --temperature 0.6 --top-k 20

# MPI collectives against serial references, run under mpirun by tests/cli/test_mpi_comm.sh.
$(BUILD)/test_comm_mpi: tests/mpi/test_comm_mpi.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# Tensor-parallel mappings, vocab-parallel embedding and cross-entropy against unsharded
# references, run under mpirun by tests/cli/test_mpi_tp_ops.sh.
$(BUILD)/test_tp_mappings: tests/mpi/test_tp_mappings.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# Checkpoints of tensor-parallel layouts, run under mpirun by tests/cli/test_mpi_tp_checkpoint.sh.
$(BUILD)/test_ckpt_tp_mpi: tests/mpi/test_ckpt_tp_mpi.c tests/unit/tiny_models.h tests/unit/tp_tables.h $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# The router over a token group against the one-process router, in float and in double, run
# under mpirun by tests/cli/test_mpi_router.sh.
$(BUILD)/test_router_group: tests/mpi/test_router_group.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)
$(BUILD)/test_router_group_dbl: tests/mpi/test_router_group.c $(DBL_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DMT_DOUBLE $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# Ring attention over a context-parallel group against one attention over the whole
# sequence, in float and in double, run under mpirun by tests/cli/test_mpi_cp_attention.sh.
$(BUILD)/test_cp_attention: tests/mpi/test_cp_attention.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)
$(BUILD)/test_cp_attention_dbl: tests/mpi/test_cp_attention.c $(DBL_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DMT_DOUBLE $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# Fuzz targets (make fuzz) and their replay drivers, run by make test (tests/fuzz/fuzz.mk).
include tests/fuzz/fuzz.mk

# The op checks (tests/gpu/): every op of a backend against the cpu backend through the
# op table; make test runs them for the cpu backend, make check-gpu for cuda (built with
# every CUDA build, so they compile and link wherever nvcc is).
OP_CHECK := $(BUILD)/test_backend_ops
$(OP_CHECK): $(sort $(wildcard tests/gpu/*.c)) tests/gpu/op_check.h $(LIB_OBJ) $(PLUGIN_OBJ)
	$(CC) $(CFLAGS) -Itests/gpu $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS) $(PLUGIN_LIBS)

ifeq ($(HAVE_CUDA),1)
.PHONY: check-gpu
check-gpu: $(BUILD)/moetron $(CUDA_PLUGIN) $(OP_CHECK) $(MPI_TEST)
	@bash tests/gpu/check_gpu.sh $(BUILD)
else
.PHONY: check-gpu
check-gpu:
	$(error make check-gpu needs the cuda backend: install the CUDA toolkit (nvcc in CUDA_HOME=$(CUDA_HOME)) and build without NO_CUDA=1 or SANITIZE=1)
endif

test: $(BUILD)/moetron $(UNIT_BIN) $(BUILD)/router_probe $(BUILD)/moment_probe $(BUILD)/quant_probe $(BUILD)/tokenize_probe $(BUILD)/indexed_probe $(MPI_TEST) $(FUZZ_REPLAY) $(CUDA_PLUGIN) $(OP_CHECK)
	@bash tests/run.sh $(BUILD)

# Throughput measurements (bench/RESULTS.md records their output).
$(BUILD)/bench_gemm: bench/bench_gemm.c $(LIB_OBJ)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# Ring attention's K/V transfer against its compute, under mpirun (bench/RESULTS.md).
$(BUILD)/bench_cp_ring: bench/bench_cp_ring.c $(LIB_OBJ)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

bench: $(BUILD)/moetron $(BUILD)/bench_gemm
	./$(BUILD)/bench_gemm
	bash bench/train_throughput.sh ./$(BUILD)/moetron
	bash bench/moe_vs_pytorch.sh ./$(BUILD)/moetron

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
