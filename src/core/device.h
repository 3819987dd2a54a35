// device.h — where the model computes: the cpu, or a CUDA GPU (--device).
//
// device_select picks the op backend (src/ops/backend.h) and the kind of memory that
// model tensors live in. Tensor memory — parameters, gradients, optimizer moments,
// activations, the KV cache, exchange buffers: whatever an op reads or writes — comes
// from device_calloc: host memory on the cpu, device memory of the GPU's stream-ordered
// pool on a GPU (never managed memory). Host code reaches it only through ops, collectives
// and the explicit copies below; --device cpu-strict proves that on the CPU. Everything
// else stays in ordinary host memory.
#pragma once
#include <stddef.h>

// DEVICE_CPU_STRICT: the cpu backend with tensor memory closed to host code outside ops,
// communication and the copies below (src/core/strict_memory.h): a host access is a crash
// naming the place. It proves on the CPU what the GPU requires.
typedef enum { DEVICE_CPU, DEVICE_CUDA, DEVICE_CPU_STRICT } DeviceKind;

// Whether this binary was built with the cuda backend, and how many GPUs it sees
// (0 when built without it, or when no driver or device answers).
int device_cuda_built(void);
int device_cuda_count(void);

// "cpu", "cuda", "cpu-strict" or "auto" (cuda when built with it and a GPU is visible, else cpu);
// anything else, or "cuda" where it cannot run, ends the run naming --device.
DeviceKind device_parse(const char *name);
// Whether name is one of DEVICE_NAMES (whether or not it can run here).
#define DEVICE_NAMES "cpu, cuda, auto or cpu-strict"
int device_name_known(const char *name);

// Selects the device before any tensor memory is allocated. Under a launcher, local rank
// r (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, ...) uses GPU r mod the GPUs visible.
// gemm_inputs (a GemmInputs of ops/gemm.h): the GEMMs' inputs rounded to bf16 or fp16 with
// fp32 accumulation (--bf16, --fp16), on either backend; GEMM_INPUTS_FP32 (0) for fp32.
void device_select(DeviceKind kind, int gemm_inputs);
// The GEMM inputs' precision of the active backend from now on (a GemmInputs), and the one
// in effect: the router sets fp32 around its GEMMs under --bf16 / --fp16 and restores it.
void device_set_gemm_inputs(int gemm_inputs);
int device_gemm_inputs(void);
DeviceKind device_active(void);
// This process's index among the processes its launcher started on this machine (0 when
// started alone): rank r uses GPU r mod the GPUs visible.
int device_local_rank(void);
// "cpu" or "cuda (<GPU name>)", for logs.
const char *device_description(void);

// Zeroed tensor memory of count × size bytes (count 0 gives a valid unique pointer);
// freed with device_free. Dies with the size when it cannot be had.
void *device_calloc(size_t count, size_t size);
void device_free(void *p);
// Zeroed host memory (not tensor memory: host code reads it) that the device copies to and
// from at full speed: page-locked on a GPU, plain on the cpu; freed with device_host_free.
void *device_host_calloc(size_t count, size_t size);
void device_host_free(void *p);
// Bytes free on the GPU in use; -1 on the cpu (see train/memory_check.c for host memory).
double device_memory_free_bytes(void);

// Explicit copies between host memory and tensor memory: the only way host code reads
// or writes tensors (checkpoints, initial values, a micro-batch's tokens, the scalars a
// step reports). device_upload returns once the host bytes are taken (the host buffer
// may be reused; on the GPU they reach the device in queue order, through pinned staging);
// device_download returns with the bytes in host memory — on the GPU it waits for the ops
// queued before it, so a step's downloads are its synchronisation points (docs/gpu.md).
void device_upload(void *dst, const void *host, size_t bytes);
void device_download(void *host, const void *src, size_t bytes);
// dst ← src (bytes), each host or tensor memory (dst == src: nothing; no other overlap): in
// queue order after the ops before it, and on return a host destination holds the bytes and
// a host source is free again (a group of one process's collectives).
void device_copy(void *dst, const void *src, size_t bytes);
// Brackets code that reaches tensor memory outside ops (communication: the MPI calls on
// tensor buffers, which a GPU build does through NCCL on device memory). Nest.
void device_access_begin(void);
void device_access_end(void);
