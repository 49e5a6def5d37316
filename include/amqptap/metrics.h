/* What `--metrics` serves, rendered from a snapshot of the tap's counters: the Prometheus text exposition
 * (format 0.0.4) of /metrics, the JSON of /api/status behind the live status page and the body of /healthz; plus
 * the tally the tracker's verdict and connection hooks feed with what the tracker does not count itself (returns by
 * reply code, return latency, publishes by exchange, the last problem publishes, the upstream's state). Pure core:
 * the caller collects what the io layer knows (forwarding engine, capture, process, HTTP side) and passes the
 * clock. */
#ifndef AMQPTAP_METRICS_H
#define AMQPTAP_METRICS_H

#include "amqptap/consume.h"
#include "amqptap/fault.h"
#include "amqptap/dir.h"
#include "amqptap/jsonl.h"
#include "amqptap/out_loss.h"
#include "amqptap/track.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the confirm latency histogram in fixed Prometheus buckets ---- */

/* Upper bounds (le) in microseconds: 1, 1.5, 2, 3, 5, 7 per decade from 100 µs to 10 s. */
#define TAP_METRICS_N_LE 31
extern const uint64_t tap_metrics_le_us[TAP_METRICS_N_LE];

struct tap_metrics_hist {
	uint64_t in_le[TAP_METRICS_N_LE + 1]; /* per bound, not cumulative; [TAP_METRICS_N_LE]: above every bound */
	uint64_t count;
	uint64_t sum_us; /* from bucket midpoints: within 1/16 of the true sum */
};

/* Folds count latencies in [lo_us, hi_us) (one bucket of the tracker's log-linear histogram) into the bucket of the
 * first bound at or above the midpoint (the tracker's buckets are 1/8 wide, so a bound moves by at most 1/16). */
void tap_metrics_hist_add(struct tap_metrics_hist *h, uint64_t lo_us, uint64_t hi_us, uint64_t count);

/* Folds a whole tracker histogram (µs) into h, bucket by bucket. */
void tap_metrics_hist_fold(struct tap_metrics_hist *h, const struct tap_hist *from);

/* ---- what the tracker's hooks tell (tap_track_set_verdict_hook, tap_track_set_conn_hook) ---- */

#define TAP_METRICS_MAX_CODES 16      /* distinct reply codes with their own series; more go to "other" */
#define TAP_METRICS_PROBLEMS 32       /* problem publishes kept for the status page */
#define TAP_METRICS_PROBLEM_BYTES 2048 /* a longer record is kept as a stub with its verdict only */
#define TAP_METRICS_MISSING 32        /* resend_missing records kept for the status page */
/* The busiest names of a kind (struct tap_metrics_top): publishes by exchange, deliveries by queue. At most
 * TAP_METRICS_EXCHANGES names have their own series, the busiest ones (counted with the Space-Saving algorithm over
 * TAP_METRICS_EXCHANGE_CANDIDATES candidates); every other one counts in "(other)" (the default exchange is
 * "(AMQP default)"; a real name's label value is never one of these, nor that of another name: see
 * tap_metrics_render_prometheus). The first TAP_METRICS_EXCHANGES names seen get a series at once, so a tap that sees
 * no more names than that counts each exactly. Past that, tap_metrics_tally_rank gives a series to a candidate whose
 * certain count is an eighth above that of the least busy name with one, which loses its series. A series counts
 * from when it was given, so every series, "(other)" included, only grows. */
#define TAP_METRICS_EXCHANGES 10
#define TAP_METRICS_EXCHANGE_CANDIDATES 64
#define TAP_METRICS_N_ROUTES 4 /* by enum tap_track_route */

/* The broker seen at the last connection attempt: a connection.open says it answered; a connection that ended
 * "unreachable" (the TCP connection could not be made), or "broker_tls_error" before its connection.open (the
 * broker's certificate or name did not verify, or its handshake failed or timed out), that no client gets through. */
enum tap_metrics_upstream { TAP_UPSTREAM_UNSEEN, TAP_UPSTREAM_REACHABLE, TAP_UPSTREAM_UNREACHABLE };

/* How connections ended, by their close record's "by": a fixed list (any other counts as "other"), so that the
 * label is bounded and every series is there from the start (an alert on increase() sees the first one). */
#define TAP_METRICS_CLOSE_BY(X)                                                                                     \
	X(client) X(broker) X(client_eof) X(broker_eof) X(client_reset) X(broker_reset) X(unreachable)            \
	X(client_tls_error) X(broker_tls_error) X(tap_fd_limit) X(tap_no_memory) X(shutdown) X(capture_end)       \
	X(capture_idle) X(capture_limit) X(other)
enum tap_metrics_close_by {
#define TAP_METRICS_CLOSE_BY_ENUM(name) TAP_CLOSE_BY_##name,
	TAP_METRICS_CLOSE_BY(TAP_METRICS_CLOSE_BY_ENUM)
#undef TAP_METRICS_CLOSE_BY_ENUM
	TAP_METRICS_N_CLOSE_BY
};
extern const char *const tap_metrics_close_by_names[TAP_METRICS_N_CLOSE_BY];

struct tap_metrics_problem {
	uint16_t len;
	char json[TAP_METRICS_PROBLEM_BYTES]; /* the publish record as written, or a stub object */
};

/* A name's counters: exchanges by enum tap_track_route, then TAP_METRICS_DROPPED (--definitions: dropped_by_topology
 * publishes); queues by enum tap_consume_outcome. */
#define TAP_METRICS_DROPPED TAP_METRICS_N_ROUTES
#define TAP_METRICS_TOP_COUNTS 5

struct tap_metrics_top_name {
	uint8_t len;
	char name[255]; /* an AMQP exchange or queue name is a shortstr */
	bool labelled;  /* has its own series */
	uint64_t seen;      /* Space-Saving count: over-counts by at most inherited */
	uint64_t inherited; /* the count of the candidate it replaced; seen - inherited is certain (the ranking's) */
	uint64_t by[TAP_METRICS_TOP_COUNTS]; /* since it got its series; 0 while it has none */
};

struct tap_metrics_top {
	struct tap_metrics_top_name names[TAP_METRICS_EXCHANGE_CANDIDATES];
	size_t n, n_labelled;
	size_t last; /* where the last one was found: most publishers use one exchange, most consumers one queue */
	uint64_t other[TAP_METRICS_TOP_COUNTS]; /* the names without a series */
};

struct tap_metrics_tally {
	uint16_t codes[TAP_METRICS_MAX_CODES];
	uint64_t returns_by_code[TAP_METRICS_MAX_CODES];
	size_t n_codes;
	uint64_t returns_other_code;
	struct tap_hist return_us; /* publish to its Basic.Return, returned publishes */
	struct tap_hist resend_us; /* an unknown (or nacked, returned) publish's publish to its resend's (§4b) */
	enum tap_metrics_upstream upstream;
	enum tap_metrics_close_by upstream_failure; /* why UNREACHABLE: unreachable or broker_tls_error */
	uint64_t closed_by[TAP_METRICS_N_CLOSE_BY];
	uint64_t problems_seen;                 /* returned, nacked or unknown publishes, ack_before_return included */
	size_t problem_next;                    /* ring position of the next one */
	struct tap_metrics_problem problems[TAP_METRICS_PROBLEMS];
	uint64_t missing_seen;                  /* resend_missing records */
	size_t missing_next;                    /* ring position of the next one */
	struct tap_metrics_problem missing[TAP_METRICS_MISSING];
	struct tap_metrics_top exchanges; /* publish records by route */
	struct tap_metrics_top queues;    /* delivery records by outcome */
	bool topology;          /* a verdict said dropped_by_topology: the family is rendered */
};

/* Reply code 312 (NO_ROUTE) has its series before the first return. */
void tap_metrics_tally_init(struct tap_metrics_tally *t);
/* A tap_track_verdict_fn (ctx: the tally): one settled publish. A few compares and the exchange lookup for a routed
 * one; a problem publish's record is copied (a stub if it is longer than TAP_METRICS_PROBLEM_BYTES or was lost)
 * without its "header_values" (--header-values; the verdict's values_at and values_len say where they are):
 * /api/status, which shows it, asks for no password. */
void tap_metrics_tally_verdict(void *tally, const struct tap_track_verdict *v);
/* A tap_track_conn_event_fn (ctx: the tally): the upstream's state, and how connections ended. */
void tap_metrics_tally_conn(void *tally, const struct tap_track_conn_event *e);
/* A tap_track_missing_fn (ctx: the tally): a resend_missing record, copied (a stub if it is longer than
 * TAP_METRICS_PROBLEM_BYTES or was lost) for the status page's latest missing resends. */
void tap_metrics_tally_missing(void *tally, struct tap_slice record);
/* A tap_consume_delivery_fn (ctx: the tally): one delivery record, counted by its queue. */
void tap_metrics_tally_delivery(void *tally, struct tap_slice queue, enum tap_consume_outcome outcome);
/* Gives the busiest exchanges and queues their series (see TAP_METRICS_EXCHANGES); call before rendering. */
void tap_metrics_tally_rank(struct tap_metrics_tally *t);

/* ---- the routing model (--definitions, --management) ---- */

/* What the app knows of the model it judges by and of reading it (app_outputs.c keeps it; the snapshot copies it on
 * the loop, where it changes). */
struct tap_metrics_topology {
	bool on;                          /* --definitions or --management given: the family is rendered */
	uint64_t polls_ok, polls_failed;  /* reads of the definitions: each --management poll; --definitions at start and
					   * at each SIGHUP. A failed one keeps the model in use */
	int64_t loaded_us;                /* when the model in use was loaded (tap_now_us); 0: none yet */
	uint64_t exchanges, queues, bindings; /* in the model in use (tap_route_counts) */
};

/* ---- the snapshot a request renders ---- */

/* One output file (--verdicts, --frames, --pcap). */
struct tap_metrics_output {
	bool on;
	uint64_t lines, lost, write_errors; /* lost: the sum of lost_by */
	uint64_t lost_by[TAP_OUT_N_LOSSES]; /* by enum tap_out_loss */
};

enum tap_metrics_out { TAP_METRICS_OUT_VERDICTS, TAP_METRICS_OUT_FRAMES, TAP_METRICS_OUT_PCAP, TAP_METRICS_N_OUT };

struct tap_metrics_snapshot {
	const char *version;
	const char *tap_id, *run; /* --tap-id and the run id of every record: from an alert to the records */
	const char *upstream_name;
	int64_t now_us, start_us;
	bool listening; /* the AMQP listener accepts clients (false while shutting down) */
	/* the tracker (tap_metrics_collect_track) */
	struct tap_track_stats track;
	struct tap_metrics_hist confirm;
	struct tap_consume_stats consume; /* the consumer side (amqptap/consume.h) */
	struct tap_metrics_hist settle;   /* its deliver -> settle latency */
	struct tap_metrics_hist queue;    /* publish -> delivery of the linked deliveries (queue_us) */
	uint64_t confirm_p50_us, confirm_p90_us, confirm_p99_us, confirm_max_us;
	uint64_t channels_open, connections_blocked;
	uint64_t decode_errors; /* decode_error records (tap_observer) */
	/* the capture (sniff); have_capture false: not capturing */
	bool have_capture;
	uint64_t capture_packets, capture_drops, capture_gaps, capture_gap_bytes;
	/* the forwarding engine */
	uint64_t accepted, active, unreachable, address_failures;
	uint64_t bytes[2]; /* by enum tap_dir */
	struct tap_metrics_output out[TAP_METRICS_N_OUT];
	/* the process (/proc/self); have_process false: not known */
	bool have_process;
	uint64_t rss_bytes, vsize_bytes, open_fds, max_fds;
	double cpu_seconds, start_time_seconds;
	/* the HTTP side itself */
	uint64_t http_open, http_total, http_timeouts, http_paused;
	uint64_t http_evicted; /* idle connections closed to make room at the cap */
	uint64_t http_renders; /* pages rendered (a copy served again is not one) */
	uint64_t http_paced;   /* requests that waited for the endpoint's rate */
	uint64_t log_lines_lost; /* lines stderr did not take (log.h, tap_log_lost) */
	/* --fault: how often each action acted (by enum tap_fault_action); have_faults false: no rules */
	bool have_faults;
	uint64_t faults[TAP_FAULT_ACTIONS];
	/* the rules in force for /api/status (borrowed from the loop, which renders at once; NULL: no --fault nor
	 * --fault-api), and whether --fault-api may change them */
	const struct tap_fault_set *fault_set;
	bool fault_api;
	struct tap_metrics_topology topology; /* topology.on false: no --definitions nor --management */
};

/* Fills the tracker's part of s: stats, the confirm histogram, quantiles, open channels and blocked connections. */
void tap_metrics_collect_track(struct tap_metrics_snapshot *s, const struct tap_track *t);

/* The Prometheus text exposition format 0.0.4 (Content-Type: text/plain; version=0.0.4). An exchange's label value
 * is its name, except that a byte that is not UTF-8 is written \xHH (two hex digits), a backslash \\, and a name
 * that begins with "(" gets a backslash in front: one name, one label value, and none is a pseudo name. */
void tap_metrics_render_prometheus(const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t,
                                   struct tap_buf *out);

/* Connection rows /api/status lists at most (the newest); the total is always given. */
#define TAP_METRICS_MAX_ROWS 100
/* unacked deliveries the consumer list looks at per render, in all (a few ms): past them a consumer's unacked is null */
#define TAP_METRICS_CONSUMER_SCAN (1u << 20)

/* The JSON of /api/status: counters, histogram, connections (track may be NULL: none), problem publishes newest
 * first. */
void tap_metrics_render_status(const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t,
                               const struct tap_track *track, struct tap_buf *out);

/* The short JSON of /healthz: listening, uptime, upstream reachable at the last attempt. */
void tap_metrics_render_health(const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t,
                               struct tap_buf *out);

#endif
