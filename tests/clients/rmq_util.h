/* Small helpers shared by the rabbitmq-c test clients and load generators.
 * Include after <amqp.h>. */
#ifndef TAP_RMQ_UTIL_H
#define TAP_RMQ_UTIL_H

#include <stdint.h>
#include <time.h>

/* Monotonic microseconds, for latencies. */
static inline uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* NULL for a normal reply, else a short reason. */
static inline const char *rpc_error(amqp_rpc_reply_t r)
{
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return NULL;
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
		return amqp_error_string2(r.library_error);
	return "broker closed the channel or connection";
}

#endif
