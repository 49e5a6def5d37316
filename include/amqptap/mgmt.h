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

/* --management-credentials: the file's first line (its line end cut) into *out, for tap_mgmt_new; 0, or -1 with err
 * (the file cannot be read, or is over 4 KiB). Free it with tap_mgmt_credentials_free, which wipes it. */
int tap_mgmt_credentials_read(const char *path, char **out, char *err, size_t cap);
void tap_mgmt_credentials_free(char *credentials);

/* What one blocking fetch came to. */
enum tap_mgmt_fetch {
	TAP_MGMT_FETCHED,     /* *body holds the 200 answer's body */
	TAP_MGMT_BAD_SETUP,   /* a bad URL, credentials or CA: nothing was asked (tap_mgmt_new's errors) */
	TAP_MGMT_NOT_ANSWERED, /* no answer (refused, DNS, timeout, TLS or its verification), not 200, too large */
};

/* One GET {url}/api/definitions on an event base of its own, waited for (`amqptap route --management`): the same
 * request, checks and bounds as a poll of tap_mgmt_new. *body (malloc'd, NUL-terminated, *len bytes) is the caller's
 * to free when TAP_MGMT_FETCHED; else err says why. */
enum tap_mgmt_fetch tap_mgmt_fetch_once(const char *url, const char *credentials, const char *ca_file, size_t max_body,
					char **body, size_t *len, char *err, size_t cap);

#endif
