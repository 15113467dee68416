/* nn/graph.h: the refusals (bad shapes, bad operands, a value produced twice) with their
 * messages, and a graph left as it was by each. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "nn/error.h"
#include "nn/graph.h"

static void test_refusals(void **state)
{
    (void)state;
    xmp_graph_t g;
    xmp_graph_init(&g);
    const int64_t d[2] = {2, 3}, z[1] = {0};
    int x = xmp_graph_value(&g, "act.x", 2, d);
    assert_int_equal(x, 0);
    assert_int_equal(xmp_graph_value(&g, "act.y", 1, z), -1);
    assert_non_null(strstr(xmp_last_error(), "value 'act.y': dim 0 is 0"));
    xmp_gref_t in[1] = {{1, 0}};
    assert_int_equal(xmp_graph_node(&g, XMP_GOP_GELU, "gelu", "gelu", 0, 0, 1, in, x, 0), -1);
    assert_non_null(strstr(xmp_last_error(), "operand 0 is parameter 0, which does not exist"));
    in[0].is_param = 0;
    int y = xmp_graph_value(&g, "act.y", 2, d);
    assert_int_equal(xmp_graph_node(&g, XMP_GOP_GELU, "gelu", "gelu", 0, 0, 1, in, y, 0), 0);
    assert_int_equal(xmp_graph_node(&g, XMP_GOP_GELU, "gelu", "gelu again", 0, 0, 1, in, y, 0),
                     -1);
    assert_non_null(strstr(xmp_last_error(), "value 1 (act.y) is already the output of node 0"));
    assert_int_equal(g.nnode, 1);
    assert_string_equal(xmp_gop_name(XMP_GOP_XENT), "xent");
    assert_null(xmp_gop_name(XMP_GOP_COUNT));
    xmp_graph_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
