#include "data/prefetch.h"

#include <string.h>

#include "core/timer.h"

static void *reader_main(void *arg) {
    Prefetcher *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->request < 0 && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        int slot = p->request;
        p->request = -1;
        int64_t first = p->slot_first[slot];
        pthread_mutex_unlock(&p->mu);
        dataset_batch(p->ds, DATA_TRAIN, first, &p->slots[slot]);
        pthread_mutex_lock(&p->mu);
        p->ready[slot] = 1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void prefetch_start(Prefetcher *p, Dataset *ds, const Config *c, int B) {
    memset(p, 0, sizeof(*p));
    p->ds = ds;
    p->request = -1;
    for (int s = 0; s < 2; s++) {
        data_batch_alloc(&p->slots[s], c, B);
        p->slot_first[s] = -1;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->thread, NULL, reader_main, p)) mt_die("cannot start the data reader thread");
}

// With the lock held: the slot holding `first`, waiting for the reader to finish it, or -1.
static int wait_for(Prefetcher *p, int64_t first) {
    for (int s = 0; s < 2; s++) {
        if (p->slot_first[s] != first) continue;
        while (!p->ready[s]) pthread_cond_wait(&p->cv, &p->mu);
        return s;
    }
    return -1;
}

const DataBatch *prefetch_get(Prefetcher *p, int64_t first, int64_t next) {
    double t0 = now_seconds();
    pthread_mutex_lock(&p->mu);
    int slot = wait_for(p, first);
    if (slot < 0) {  // not asked for (the first batch, or a jump): let the reader go idle, read it here
        for (int s = 0; s < 2; s++)
            while (p->slot_first[s] >= 0 && !p->ready[s]) pthread_cond_wait(&p->cv, &p->mu);
        slot = 0;
        p->slot_first[slot] = first;
        pthread_mutex_unlock(&p->mu);
        dataset_batch(p->ds, DATA_TRAIN, first, &p->slots[slot]);
        pthread_mutex_lock(&p->mu);
        p->ready[slot] = 1;
    }
    p->waited_s += now_seconds() - t0;
    int other = 1 - slot;
    p->slot_first[other] = next;
    p->ready[other] = 0;
    if (next >= 0) {
        p->request = other;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return &p->slots[slot];
}

void prefetch_stop(Prefetcher *p) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    for (int s = 0; s < 2; s++) data_batch_free(&p->slots[s]);
}
