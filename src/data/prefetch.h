// prefetch.h — the next training micro-batch is read on a background thread while the
// current one computes. Two DataBatch slots: the one handed out and the one being filled.
// The time the training loop still had to wait for data is counted (metrics: data_wait_s).
#pragma once
#include <pthread.h>

#include "data/dataset.h"

typedef struct {
    Dataset *ds;
    DataBatch slots[2];
    int64_t slot_first[2];   // the sample position a slot holds or is being filled with (-1: none)
    int ready[2];
    int request;             // slot the reader should fill next, or -1
    int stop;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    double waited_s;         // total time prefetch_get blocked
} Prefetcher;

void prefetch_start(Prefetcher *p, Dataset *ds, const Config *c, int B);
// The train micro-batch at sample position `first` (waits until it is read; reads it
// here if it was not asked for), valid until the next call; then starts reading the one
// at `next` (-1: none).
const DataBatch *prefetch_get(Prefetcher *p, int64_t first, int64_t next);
void prefetch_stop(Prefetcher *p);
