/* Internal: the dense calls' tasks (attention.c), for every entry point that states its work as
 * attention problems (the paged call states one per sequence). */
#ifndef SDPA_SRC_ATTENTION_H
#define SDPA_SRC_ATTENTION_H

#include "attention_problem.h"

/* Runs p, checked (sdpa_problem_check or its equal) and with keys (len_kv > 0), on the call's
   threads: its planned units, split over keys where the plan says, merged in key order. */
void attention_run_all(const attention_problem *p);

/* p's rows when it has no key (len_kv == 0): zeros, and a log-sum-exp of the sink's term alone
   (-inf with none). */
void attention_no_keys(const attention_problem *p);

/* Whether p's plan shares it among `threads` threads (plan.h): one that does not costs too
   little to wake a thread for, and a batch of them runs side by side, one a thread. */
int attention_shares_threads(const attention_problem *p, size_t threads);

#endif
