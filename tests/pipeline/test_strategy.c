/* Strategies as data (nn/strategy.h): round trips, lookup, loading from a
 * file and from built-ins, and every parse error with its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "nn/strategy.h"

static const char *mega2 = "# strategy megatron, 2 axes (dp, tp)\n"
                           "strategy megatron axes=2\n"
                           "wte      = B,S(0)\n"
                           "\n"
                           "qkv.w    = B,S(1)   # heads\n"
                           "fc.w     = B,S(0)            store S(0),S(0)\n"
                           "act.x    = S(0),B\n"
                           "act.p    = P,S(7)\n";

static void test_parse_lookup(void **state)
{
    (void)state;
    xmp_strategy_t s;
    char err[512] = "";
    assert_int_equal(xmp_strategy_parse(mega2, "m.txt", &s, err, sizeof err), 0);
    assert_string_equal(s.name, "megatron");
    assert_int_equal(s.naxes, 2);
    assert_int_equal(s.n, 5);
    const xmp_strategy_entry_t *e = xmp_strategy_get(&s, "fc.w");
    assert_non_null(e);
    assert_int_equal(e->line, 6);
    assert_int_equal(e->sbp[0].kind, XMP_B);
    assert_int_equal(e->sbp[1].kind, XMP_S);
    assert_int_equal(e->sbp[1].dim, 0);
    assert_true(e->has_store);
    assert_int_equal(e->store[0].kind, XMP_S);
    assert_int_equal(e->store[1].dim, 0);
    e = xmp_strategy_get(&s, "qkv.w");
    assert_non_null(e);
    assert_false(e->has_store);
    assert_int_equal(e->sbp[1].dim, 1);
    e = xmp_strategy_get(&s, "act.p");
    assert_int_equal(e->sbp[0].kind, XMP_P);
    assert_int_equal(e->sbp[1].dim, 7);
    assert_null(xmp_strategy_get(&s, "fc.b"));
    assert_null(xmp_strategy_get(&s, "fc"));
}

static void test_round_trip(void **state)
{
    (void)state;
    /* Every axis count, every kind of token, with and without storage. */
    const char *texts[] = {
        "strategy a axes=1\nx = B\ny = S(3) store P\n",
        mega2,
        "strategy three-d axes=3\nw = B,S(0),S(1)\na = S(0),B,S(2)  store S(0),S(1),S(1)\n",
        "strategy q axes=4\nw=S(0),S(1),P,B\nv =B,B,B,B store S(0),S(0),S(0),S(0)\n",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        xmp_strategy_t a, b;
        char err[512] = "", buf[4096], buf2[4096];
        assert_int_equal(xmp_strategy_parse(texts[i], NULL, &a, err, sizeof err), 0);
        int n = xmp_strategy_format(&a, buf, sizeof buf);
        assert_int_equal(n, (int)strlen(buf));
        assert_int_equal(xmp_strategy_parse(buf, "formatted", &b, err, sizeof err), 0);
        assert_true(xmp_strategy_equal(&a, &b));
        xmp_strategy_format(&b, buf2, sizeof buf2);
        assert_string_equal(buf, buf2); /* format is a fixed point */
        /* Truncated output is still NUL-terminated and reports the full length. */
        char small[8];
        assert_int_equal(xmp_strategy_format(&a, small, sizeof small), n);
        assert_int_equal((int)strlen(small), 7);
        /* A changed entry is not equal. */
        b.e[0].sbp[0] = b.e[0].sbp[0].kind == XMP_B ? xmp_sbp_p() : xmp_sbp_b();
        assert_false(xmp_strategy_equal(&a, &b));
    }
}

typedef struct {
    const char *text, *msg;
} bad_t;

static void test_errors(void **state)
{
    (void)state;
    const bad_t bad[] = {
        {"", "<text>: empty strategy"},
        {"# only a comment\n\n", "empty strategy"},
        {"x = B\n", "<text>:1: expected the header 'strategy NAME axes=N'"},
        {"strategy\n", "<text>:1: header: bad or missing strategy name"},
        {"strategy s\n", "<text>:1: header: expected 'axes=N' after the name 's'"},
        {"strategy s axes=0\n", "<text>:1: header: axes=0 out of range [1, 4]"},
        {"strategy s axes=5\n", "axes=5 out of range"},
        {"strategy s axes=2 extra\n", "<text>:1: header: unexpected 'extra' after axes=2"},
        {"strategy s axes=2\n\nfc.w B,B\n", "<text>:3: class 'fc.w': expected '='"},
        {"strategy s axes=2\n= B,B\n", "<text>:2: expected 'CLASS = SBP,...'"},
        {"strategy s axes=2\nfc.w = B\n", "<text>:2: class 'fc.w': SBP has 1 axes, the strategy "
                                          "has axes=2"},
        {"strategy s axes=2\nfc.w = B,B,B\n", "SBP has 3 axes, the strategy has axes=2"},
        {"strategy s axes=2\nfc.w = B,Q\n", "<text>:2: class 'fc.w': SBP axis 1: bad SBP 'Q'"},
        {"strategy s axes=2\nfc.w = S(8),B\n", "class 'fc.w': SBP axis 0: bad SBP 'S(8)'"},
        {"strategy s axes=2\nfc.w = S0,B\n", "SBP axis 0: bad SBP 'S0'"},
        {"strategy s axes=2\nfc.w = Bx,B\n", "SBP axis 0: bad SBP 'Bx'"},
        {"strategy s axes=2\nfc.w = B,B,\n", "SBP axis 2: bad SBP ''"},
        {"strategy s axes=2\nfc.w = B,B stor B,B\n",
         "<text>:2: class 'fc.w': unexpected 'stor B,B'"},
        {"strategy s axes=2\nfc.w = B,B store B\n", "class 'fc.w': storage SBP has 1 axes"},
        {"strategy s axes=2\nfc.w = B,B store B,X\n", "class 'fc.w': storage SBP axis 1: bad "
                                                      "SBP 'X'"},
        {"strategy s axes=2\nfc.w = B,B store B,B junk\n", "unexpected 'junk' after the storage"},
        {"strategy s axes=1\na = B\nb = B\na = P\n", "<text>:4: class 'a' given twice (first on "
                                                     "line 2)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        xmp_strategy_t s;
        memset(&s, 0x5a, sizeof s);
        xmp_strategy_t keep = s;
        char err[512] = "";
        assert_int_equal(xmp_strategy_parse(bad[i].text, NULL, &s, err, sizeof err), -1);
        if (!strstr(err, bad[i].msg)) {
            print_error("case %zu: message '%s' lacks '%s'\n", i, err, bad[i].msg);
            fail();
        }
        assert_memory_equal(&s, &keep, sizeof s); /* untouched on error */
    }
    /* Too many classes. */
    char *big = malloc((XMP_STRATEGY_MAX_CLASSES + 2) * 32 + 64);
    size_t at = (size_t)sprintf(big, "strategy big axes=1\n");
    for (int i = 0; i < XMP_STRATEGY_MAX_CLASSES + 1; i++)
        at += (size_t)sprintf(big + at, "c%d = B\n", i);
    xmp_strategy_t s;
    char err[512];
    assert_int_equal(xmp_strategy_parse(big, "big", &s, err, sizeof err), -1);
    char want[64];
    snprintf(want, sizeof want, "big:%d: more than %d classes", XMP_STRATEGY_MAX_CLASSES + 2,
             XMP_STRATEGY_MAX_CLASSES);
    assert_non_null(strstr(err, want));
    free(big);
}

static int builtins(const char *name, int naxes, char *text, size_t n, char *err, size_t errlen)
{
    if (!strcmp(name, "refused")) {
        snprintf(err, errlen, "built-in 'refused' needs sharded storage");
        return -1;
    }
    if (strcmp(name, "allb"))
        return 1;
    size_t at = (size_t)snprintf(text, n, "strategy allb axes=%d\nw = ", naxes);
    for (int a = 0; a < naxes; a++)
        at += (size_t)snprintf(text + at, n - at, "%sB", a ? "," : "");
    snprintf(text + at, n - at, "\n");
    return 0;
}

static void test_load(void **state)
{
    (void)state;
    xmp_strategy_t s;
    char err[512] = "";
    for (int ax = 1; ax <= 4; ax++) {
        assert_int_equal(xmp_strategy_load("allb", builtins, "allb", ax, &s, err, sizeof err), 0);
        assert_int_equal(s.naxes, ax);
        assert_string_equal(s.source, "built-in allb");
    }
    assert_int_equal(xmp_strategy_load("nosuch", builtins, "allb, refused", 2, &s, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "strategy 'nosuch': no such file and no built-in of that name "
                                "(built-ins: allb, refused)"));
    assert_int_equal(xmp_strategy_load("refused", builtins, "allb", 2, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "needs sharded storage"));
    assert_int_equal(xmp_strategy_load("allb", builtins, "allb", 5, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "mesh of 5 axes"));
    /* From a file: line numbers and the path in messages. */
    char path[] = "/tmp/xmp_strategy_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(mega2, f);
    fclose(f);
    assert_int_equal(xmp_strategy_load(path, builtins, "allb", 2, &s, err, sizeof err), 0);
    assert_string_equal(s.source, path);
    assert_int_equal(xmp_strategy_get(&s, "act.x")->line, 7);
    assert_int_equal(xmp_strategy_load(path, builtins, "allb", 3, &s, err, sizeof err), -1);
    char want[512];
    snprintf(want, sizeof want, "%s: strategy 'megatron' has axes=2, the stage mesh has 3 axes",
             path);
    assert_string_equal(err, want);
    f = fopen(path, "w");
    fputs("strategy bad axes=2\nwte = B,S(0)\nfc.w = B,S(x)\n", f);
    fclose(f);
    assert_int_equal(xmp_strategy_load(path, builtins, "allb", 2, &s, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s:3: class 'fc.w': SBP axis 1: bad SBP 'S(x)'", path);
    assert_non_null(strstr(err, want));
    unlink(path);
}

static void test_classes(void **state)
{
    (void)state;
    xmp_strategy_t s;
    char err[512];
    const char *known[] = {"wte", "qkv.w", "fc.w", "act.x", "act.p"};
    const char *req[] = {"wte", "act.x"};
    assert_int_equal(xmp_strategy_parse(mega2, "m.txt", &s, err, sizeof err), 0);
    assert_int_equal(xmp_strategy_check_classes(&s, known, 5, req, 2, err, sizeof err), 0);
    assert_int_equal(xmp_strategy_check_classes(&s, known, 4, req, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "m.txt:8: unknown class 'act.p' (known: wte qkv.w fc.w act.x)"));
    const char *req2[] = {"wte", "lnf.w"};
    assert_int_equal(xmp_strategy_check_classes(&s, known, 5, req2, 2, err, sizeof err), -1);
    assert_string_equal(err, "m.txt: class 'lnf.w' missing (strategy 'megatron' must give it)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_lookup), cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_errors),       cmocka_unit_test(test_load),
        cmocka_unit_test(test_classes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
