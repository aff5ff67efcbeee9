/* Prints the backend the library chose at load time, or with the argument "exp" the exp mode,
 * or with "threads" the thread count (for test_dispatch.c). */
#include <stdio.h>
#include <string.h>

#include "sdpa.h"

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    if (strcmp(what, "threads") == 0)
        printf("%zu\n", sdpa_num_threads());
    else
        printf("%s\n", strcmp(what, "exp") == 0 ? sdpa_exp_mode() : sdpa_backend());
    return 0;
}
