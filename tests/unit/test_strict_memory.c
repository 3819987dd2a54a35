// test_strict_memory.c — --device cpu-strict's closed tensor memory: ops and explicit
// copies reach it, host code outside them crashes with a line naming the place.
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/device.h"
#include "ops/ops.h"
#include "testlib.h"

// A host read of tensor memory outside an op (the place the crash must name).
__attribute__((noinline)) static float host_peek_tensor(const float *x) { return x[3]; }

static void test_ops_and_copies_reach_it(void) {
    float host[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8] = {0};
    float *x = device_calloc(8, sizeof(float)), *y = device_calloc(8, sizeof(float));
    device_upload(x, host, sizeof(host));
    vec_copy(y, x, 8);  // an op: opened for its length
    vec_scale(y, 2, 8);
    device_download(back, y, sizeof(back));
    for (int i = 0; i < 8; i++) CHECK(back[i] == 2 * host[i], "element %d: %g", i, back[i]);
    double ss = vec_sum_squares(x, 8);
    CHECK(ss == 204, "sum of squares %g", ss);
    device_free(x);
    device_free(y);
}

// In a child: touching tensor memory from host code ends it with status 134 and the line.
static void test_host_access_names_the_place(void) {
    int pipefd[2];
    CHECK(pipe(pipefd) == 0, "pipe");
    pid_t child = fork();
    if (child == 0) {
        dup2(pipefd[1], STDERR_FILENO);
        close(pipefd[0]);
        float *x = device_calloc(8, sizeof(float));
        printf("%g\n", host_peek_tensor(x));  // must not return
        _exit(0);
    }
    close(pipefd[1]);
    char text[8192] = {0};
    size_t got = 0;
    ssize_t r;
    while (got < sizeof(text) - 1 && (r = read(pipefd[0], text + got, sizeof(text) - 1 - got)) > 0) got += (size_t)r;
    close(pipefd[0]);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 134, "the child ends with 134 (status %d)", status);
    CHECK(strstr(text, "host code touched tensor memory outside an op") != NULL, "the error line: %.200s", text);
    CHECK(strstr(text, "byte 12 of a block of 32 bytes") != NULL, "names the byte and block: %.200s", text);
    CHECK(strstr(text, "host_peek_tensor") != NULL, "names the function: %.400s", text);
}

int main(void) {
    device_select(device_parse("cpu-strict"), 0);
    RUN(test_ops_and_copies_reach_it);
    RUN(test_host_access_names_the_place);
    return tl_failed_cases != 0;
}
