/* Prints the backend the library chose at load time (for test_dispatch.c). */
#include <stdio.h>

#include "sdpa.h"

int main(void) {
    printf("%s\n", sdpa_backend());
    return 0;
}
