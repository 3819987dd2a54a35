// pipeline.h — a training step's micro-batches through this rank's model chunks, in the
// order of its schedule (train/pp_schedule.h), with each chunk's output activations and
// input gradients sent point to point to the neighbouring pipeline stages.
//
// Without pipeline parallelism the schedule is the trivial one (each micro-batch forward
// then backward, one chunk holding the whole model) and nothing is sent: the trainer runs
// the same code for every layout. Each chunk keeps as many activation sets (slots) as it
// has micro-batches in flight at once; micro-batch mb uses slot mb mod slots (forwards and
// backwards of a chunk both go in micro-batch order, so that slot is free again).
//
// Sends start as soon as a chunk's output is ready and complete in the background; a
// receive waits when its data is first needed, and that wait is the measured bubble.
// Every rank follows Megatron's order, in which each receive's send comes earlier in the
// sender's own order: eager sends cannot deadlock.
#pragma once
#include "model/model.h"
#include "parallel/comm.h"
#include "train/pp_schedule.h"

// What the step supplies: its micro-batches and what happens after each forward.
typedef struct {
    // The part of micro-batch mb this rank computes (valid until the step ends; asked for
    // in increasing mb order the first time, and again when another chunk runs it).
    const Batch *(*batch)(void *ctx, int micro_batch);
    // After the forward of micro-batch mb on chunk a->chunk (losses, router statistics).
    void (*forward_done)(void *ctx, const ModelActs *a, int micro_batch);
    // During each chunk's last backward: a part's gradients are complete (or NULL).
    GradsReadyFn grads_ready;
    void *ctx;
    double loss_scale;  // of every micro-batch's objective
} PipelineStep;

typedef struct {
    Model *model;
    const Comm *pp;            // the pipeline group (size 1 without PP)
    PpSchedule schedule;
    int *slots;                // (chunks) activation sets of each chunk
    ModelActs **acts;          // (chunks)(slots)
    CommRequest **sent_out;    // (chunks)(slots) the forward output's send in flight
    CommRequest **sent_grad;   // (chunks)(slots) the input gradient's send in flight
    int B, T;                  // micro-batch shape on this rank (T: tokens of a sequence here)
    double waited_s;           // the last step: seconds waiting for the neighbours
    double step_s;             // ... and the step's schedule in all
} Pipeline;

// The schedule of `micro_batches` per step (combined: the combined 1F1B one, whose paired
// forward and backward run together); dies with one line naming the flags when Megatron
// refuses it. Nothing large is allocated until pipeline_allocate.
void pipeline_init(Pipeline *pl, Model *m, const Comm *pp, int micro_batches, int group, int combined, int B,
                   int T);
// Bytes of one micro-batch's activations of chunk k: its buffer plan (returned) and the
// expert-parallel exchange state its layers hold besides, at its bound (*exchange).
double pipeline_chunk_bytes(const Pipeline *pl, int k, double *exchange);
// Bytes of every activation set the schedule keeps (for the memory estimate): the plans
// (returned), and in *exchange their exchange state with the passes' exchange scratch (0
// without expert parallelism).
double pipeline_activation_bytes(const Pipeline *pl, double *exchange);
void pipeline_allocate(Pipeline *pl);
void pipeline_free(Pipeline *pl);

// One step's forwards and backwards; gradients accumulate into the model's table.
void pipeline_run(Pipeline *pl, const PipelineStep *step);
// A forward of one micro-batch through every stage (evaluation); the loss on the rank
// holding the head, 0 elsewhere.
double pipeline_forward_only(Pipeline *pl, const Batch *batch);
