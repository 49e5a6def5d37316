/* The `--metrics` HTTP endpoint (io layer): libevent's evhttp on a thread of its own, `http`, serving /metrics
 * (Prometheus), /healthz, /api/status and the live status page at /. The forwarding loop only renders the pages, from
 * counters the tracker and the proxy keep anyway, each at most once per TAP_ADMIN_CACHE_MS however many ask; every
 * request is accepted, parsed and answered on the http thread, at a lower CPU priority than the loop, so forwarding
 * never waits for a client of the endpoint. The HTTP side is bounded: request headers and body size, live
 * connections (at the cap a new one takes the place of the one longest without a request), an idle timeout, a
 * deadline for each request, and a rate of requests (all clients together): past it requests wait their turn in
 * the order they came, one per connection (evhttp reads a connection's next request once its last is answered), so
 * a client that asks as fast as it can costs the machine that rate's CPU and a scrape waits behind one request of
 * each other client at most. No password: anyone who reaches the port reads it all, which tap_admin_new says on
 * stderr when it is not on loopback (only --fault-api's /api/faults may ask for a token: fault_http.h). */
#ifndef AMQPTAP_ADMIN_H
#define AMQPTAP_ADMIN_H

#include "amqptap/fault.h"
#include "amqptap/conf.h"
#include "amqptap/jsonl.h"
#include "amqptap/metrics.h"

#include <stddef.h>

#define TAP_ADMIN_MAX_CONNS 32          /* live HTTP connections; at the cap the longest without a request is closed */
#define TAP_ADMIN_MAX_HEADERS 8192      /* request line and headers, bytes */
#define TAP_ADMIN_MAX_BODY 1024         /* request body, bytes (every page is a GET; POST /api/faults: fault_http.h) */
#define TAP_ADMIN_MAX_INPUT 65536       /* bytes read ahead of the request being answered (pipelining) */
#define TAP_ADMIN_IDLE_SECONDS 5        /* no byte read or written for this long: closed */
#define TAP_ADMIN_REQUEST_SECONDS 10    /* a whole request must arrive within this of the connection or last reply */
#define TAP_ADMIN_CACHE_MS 1000         /* a rendered page is served again for this long (well under a scrape interval) */
#define TAP_ADMIN_RENDER_WAIT_MS 2000   /* a request waits this long for the loop to render its page, then gets a 503 */
#define TAP_ADMIN_RATE 100              /* requests answered a second, all clients together; more wait */
#define TAP_ADMIN_BURST 50              /* taken at once after a quiet spell before the rate holds them back */

struct event_base;
struct tap_admin;
struct tap_fault_http;
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
	const char *tap_id, *run;                    /* as in the records (start_metrics sets them) */
	const char *hosts;                           /* --metrics-host: further names of the Host header */
	const struct tap_fault_set *faults;          /* --fault, --fault-api: the rules in force; NULL: neither */
	struct tap_fault_http *fault_http;           /* --fault-api: /api/faults (fault_http.h); NULL: 404 there */
	const struct tap_metrics_topology *topology; /* --definitions, --management; NULL: neither (read on the loop) */
};

/* Listens on addr (on the http thread it starts); the pages are rendered on base's loop. Returns NULL with a one-line reason in err. Writes the bound address
 * ("127.0.0.1:9464") into bound; logs one WARNING line when that is not a loopback address. */
struct tap_admin *tap_admin_new(struct event_base *base, const struct tap_conf_addr *addr,
                                const struct tap_admin_sources *src, char *bound, size_t bound_cap, char *err,
                                size_t err_cap);
/* The tally to hand the tracker's hooks as their ctx (tap_metrics_tally_verdict, tap_metrics_tally_conn); it lives
 * until tap_admin_free. */
struct tap_metrics_tally *tap_admin_tally(struct tap_admin *a);
/* The AMQP listener stopped accepting (shutdown began): /healthz answers 503 from now on. a may be NULL. */
void tap_admin_stopping(struct tap_admin *a);
/* Stops the http thread and closes the endpoint; a may be NULL. Call before freeing the event base. */
void tap_admin_free(struct tap_admin *a);

#endif
