/* Internal: the detail of a failed call, for sdpa_last_error_detail. Every public entry point
 * that returns an error returns it through sdpa_fail, so the detail always belongs to the call
 * that failed last on this thread. */
#ifndef SDPA_SRC_ERROR_H
#define SDPA_SRC_ERROR_H

#include "sdpa.h"

/* Records the printf-style message as this thread's detail and returns status. Only on error
 * paths: it formats a string. */
sdpa_status sdpa_fail(sdpa_status status, const char *format, ...)
    __attribute__((format(printf, 2, 3), cold));

#endif
