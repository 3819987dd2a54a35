// Build-time probe: the Makefile compiles this to decide whether to use OpenBLAS.
#include <cblas.h>
int main(void) {
    float a = 1, b = 1, c = 0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.f, &a, 1, &b, 1, 0.f, &c, 1);
    return c == 1 ? 0 : 1;
}
