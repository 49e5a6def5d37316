/* --management: the broker's definitions polled from the RabbitMQ management API (io: libevent's HTTP client). */
#ifndef AMQPTAP_MGMT_H
#define AMQPTAP_MGMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct tap_mgmt;

/* One poll's outcome: the body of a 200 answer (valid during the call), or err (the body NULL). */
typedef void (*tap_mgmt_fn)(void *arg, const char *body, size_t len, const char *err);

/* Polls GET {url}/api/definitions at once and every interval_us, one request at a time (10 s timeout, bodies over
 * max_body refused). credentials: "user:password" (NULL: none). https: the chain is verified against ca_file
 * (NULL: the system store) and the host name checked. NULL with err on a bad URL, credentials or CA. */
struct tap_mgmt *tap_mgmt_new(struct event_base *base, const char *url, const char *credentials, const char *ca_file,
			      int64_t interval_us, size_t max_body, tap_mgmt_fn fn, void *arg, char *err, size_t cap);
void tap_mgmt_free(struct tap_mgmt *m);

#endif
