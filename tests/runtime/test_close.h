/* test_close.h - the cmocka runtime tests' comparison of a float32 kernel's result with a
 * double reference: every element within tol times the reference's largest magnitude (at least
 * 1e-6). Include after cmocka.h. */
#ifndef NETC_TEST_CLOSE_H
#define NETC_TEST_CLOSE_H

#include <math.h>
#include <stdint.h>

static inline void assert_close(const float *got, const double *want, int64_t n, double tol, const char *what) {
    double scale = 1e-6;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > tol * scale) {
            print_error("%s[%lld]: got %g want %g (tolerance %g)\n", what, (long long)i, got[i], want[i], tol * scale);
            fail();
        }
}

#endif
