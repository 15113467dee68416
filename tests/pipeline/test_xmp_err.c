/* util/xmp_err.h: the caller-buffer formatter writes exactly what vsnprintf would (cut at
 * errlen - 1, NUL-terminated, nothing for a NULL or empty buffer), returns -1, and keeps a
 * message that wraps the buffer's previous contents whole (an argument pointing into err);
 * xmp_rule_msg (nn/sbp_ops.h), built on it, gives the prefix-then-detail message at every
 * buffer size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nn/sbp_ops.h"
#include "util/xmp_err.h"

static void test_like_snprintf(void **state)
{
    (void)state;
    const char *want = "stage 3: mesh 2x2: bad SBP 'S(9)'";
    char buf[64], ref[64];
    for (size_t n = 1; n <= sizeof buf; n++) {
        memset(buf, '#', sizeof buf);
        memset(ref, '#', sizeof ref);
        assert_int_equal(xmp_err_buf(buf, n, "stage %d: mesh %dx%d: bad SBP '%s'", 3, 2, 2, "S(9)"),
                         -1);
        snprintf(ref, n, "%s", want);
        if (memcmp(buf, ref, sizeof buf))
            fail_msg("errlen %zu: '%s', snprintf gives '%s'", n, buf, ref);
    }
    assert_string_equal(buf, want);
    /* no buffer: nothing written, still -1 */
    memset(buf, '#', sizeof buf);
    assert_int_equal(xmp_err_buf(NULL, 10, "x %d", 1), -1);
    assert_int_equal(xmp_err_buf(buf, 0, "x %d", 1), -1);
    assert_true(buf[0] == '#');
}

/* The buffer's own contents as an argument: small (formatted on the stack) and large (the
 * formatter's heap path) buffers, the wrapped message kept whole, or cut at the end only. */
static void test_wraps_own_buffer(void **state)
{
    (void)state;
    static const size_t sizes[] = {64, 1024, 1500, 4000};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        char *buf = malloc(n), *inner = malloc(n), *want = malloc(2 * n + 16);
        assert_non_null(buf);
        assert_non_null(inner);
        assert_non_null(want);
        for (size_t i = 0; i + 1 < n; i++) /* a message that is not periodic */
            inner[i] = (char)('a' + (i * 7 + i / 26) % 26);
        inner[s % 2 ? n - 5 : n * 3 / 4] = '\0'; /* odd: cut at the end */
        strcpy(buf, inner);
        xmp_err_buf(buf, n, "layer %d: %s", 12, buf);
        snprintf(want, 2 * n + 16, "layer %d: %s", 12, inner);
        want[n - 1] = '\0';
        size_t at = 0;
        while (buf[at] && buf[at] == want[at])
            at++;
        if (buf[at] != want[at])
            fail_msg("errlen %zu: the wrapped message differs at byte %zu", n, at);
        free(buf);
        free(inner);
        free(want);
    }
}

/* "op: operand X 'spec': mesh axis a: detail", cut at n - 1 like one snprintf of the whole. */
static void test_rule_msg(void **state)
{
    (void)state;
    xmp_sbp_t sbp[2] = {{XMP_S, 1}, {XMP_B, 0}};
    char spec[64], whole[256], buf[160];
    xmp_sbp_string(sbp, 2, spec, sizeof spec);
    snprintf(whole, sizeof whole, "matmul: operand A '%s': mesh axis 1: split dim %d of %d", spec,
             1, 2);
    for (size_t n = 1; n <= sizeof buf; n++) {
        memset(buf, '#', sizeof buf);
        xmp_rule_msg(buf, n, "matmul", "A", sbp, 2, 1, "split dim %d of %d", 1, 2);
        char ref[sizeof whole];
        size_t len = strlen(whole) < n - 1 ? strlen(whole) : n - 1;
        memcpy(ref, whole, len);
        ref[len] = '\0';
        if (strcmp(buf, ref))
            fail_msg("n %zu: '%s', expected '%s'", n, buf, ref);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_like_snprintf),
        cmocka_unit_test(test_wraps_own_buffer),
        cmocka_unit_test(test_rule_msg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
