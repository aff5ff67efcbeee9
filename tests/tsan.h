/* TSAN_BUILD: 1 when built with ThreadSanitizer, where every access costs tens of times more and
 * a race is found the first time it happens, so the concurrency tests repeat less. */
#ifndef SDPA_TESTS_TSAN_H
#define SDPA_TESTS_TSAN_H

#if defined(__SANITIZE_THREAD__) /* gcc */
#define TSAN_BUILD 1
#elif defined(__has_feature) /* clang */
#if __has_feature(thread_sanitizer)
#define TSAN_BUILD 1
#endif
#endif
#ifndef TSAN_BUILD
#define TSAN_BUILD 0
#endif

#endif
