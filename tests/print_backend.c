/* Prints the backend the library chose at load time, or with the argument "exp" the exp mode
 * (for test_dispatch.c). */
#include <stdio.h>
#include <string.h>

#include "sdpa.h"

int main(int argc, char **argv) {
    printf("%s\n", argc > 1 && strcmp(argv[1], "exp") == 0 ? sdpa_exp_mode() : sdpa_backend());
    return 0;
}
