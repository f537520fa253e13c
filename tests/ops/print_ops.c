/* print_ops - the IR operator table (compiler/ir/ops.def) as the markdown list in
 * docs/compiler.md; check_ops_doc.sh compares the two. */
#include "ir.h"

int main(void) {
    ir_print_ops(stdout);
    return 0;
}
