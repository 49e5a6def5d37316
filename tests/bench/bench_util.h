/* Helpers shared by the load generators in tests/bench (after <amqp.h>). */
#ifndef TAP_BENCH_UTIL_H
#define TAP_BENCH_UTIL_H

#include "../clients/rmq_util.h"
#include "amqptap/jsonl.h"

#include <stdio.h>

/* "key": v with a fixed number of decimals. */
static inline void kv_fixed(struct tap_json *j, const char *key, double v, int decimals)
{
	char num[64];
	int n = snprintf(num, sizeof num, "%.*f", decimals, v);
	tap_json_key(j, key);
	tap_json_raw(j, num, (size_t)n);
}

#endif
