/* The `--metrics` HTTP endpoint (io layer): libevent's evhttp on the forwarding loop serving /metrics (Prometheus),
 * /healthz, /api/status and the live status page at /. A request renders from counters the tracker and the proxy
 * keep anyway; forwarding never waits for it, and each page is rendered at most once per TAP_ADMIN_CACHE_MS however
 * many ask. The HTTP side is bounded: request headers and body size, live connections (at the cap a new one takes
 * the place of the one longest without a request), an idle timeout and a deadline for each request. No password:
 * anyone who reaches the port reads it all, which tap_admin_new says on stderr when it is not on loopback. */
#ifndef AMQPTAP_ADMIN_H
#define AMQPTAP_ADMIN_H

#include "amqptap/conf.h"
#include "amqptap/jsonl.h"
#include "amqptap/metrics.h"

#include <stddef.h>

#define TAP_ADMIN_MAX_CONNS 32          /* live HTTP connections; at the cap the longest without a request is closed */
#define TAP_ADMIN_MAX_HEADERS 8192      /* request line and headers, bytes */
#define TAP_ADMIN_MAX_BODY 1024         /* request body, bytes (every page is a GET) */
#define TAP_ADMIN_MAX_INPUT 65536       /* bytes read ahead of the request being answered (pipelining) */
#define TAP_ADMIN_IDLE_SECONDS 5        /* no byte read or written for this long: closed */
#define TAP_ADMIN_REQUEST_SECONDS 10    /* a whole request must arrive within this of the connection or last reply */
#define TAP_ADMIN_CACHE_MS 1000         /* a rendered page is served again for this long (well under a scrape interval) */

struct event_base;
struct tap_admin;
struct tap_observer;
struct tap_proxy;
struct tap_sniff;
struct tap_track;

/* What a request reads; every pointer borrowed, NULL when absent, and must outlive the admin. */
struct tap_admin_sources {
	const char *upstream_name;
	const struct tap_track *track;
	const struct tap_proxy *proxy;
	struct tap_out *outputs[TAP_METRICS_N_OUT]; /* by enum tap_metrics_out; NULL: not asked for */
	const struct tap_observer *observer;         /* decode errors and capture gaps */
	struct tap_sniff *sniff;                     /* `amqptap sniff`: packets and kernel drops */
};

/* Listens on addr with the base's loop. Returns NULL with a one-line reason in err. Writes the bound address
 * ("127.0.0.1:9464") into bound; logs one WARNING line when that is not a loopback address. */
struct tap_admin *tap_admin_new(struct event_base *base, const struct tap_conf_addr *addr,
                                const struct tap_admin_sources *src, char *bound, size_t bound_cap, char *err,
                                size_t err_cap);
/* The tally to hand the tracker's hooks as their ctx (tap_metrics_tally_verdict, tap_metrics_tally_conn); it lives
 * until tap_admin_free. */
struct tap_metrics_tally *tap_admin_tally(struct tap_admin *a);
/* The AMQP listener stopped accepting (shutdown began): /healthz answers 503 from now on. a may be NULL. */
void tap_admin_stopping(struct tap_admin *a);
/* Closes the endpoint; a may be NULL. Call before freeing the event base. */
void tap_admin_free(struct tap_admin *a);

#endif
