/* What `--metrics` serves, rendered from a snapshot of the tap's counters: the Prometheus text exposition
 * (format 0.0.4) of /metrics, the JSON of /api/status behind the live status page and the body of /healthz; plus
 * the tally kept from the record stream (returns by reply code, decode errors, the last problem publishes) for
 * what the tracker does not count itself (warnings by rule are the tracker's tap_track_stats.warnings_by_rule). Pure core: the caller collects what the io layer knows
 * (forwarding engine, process, HTTP side) and passes the clock. */
#ifndef AMQPTAP_METRICS_H
#define AMQPTAP_METRICS_H

#include "amqptap/dir.h"
#include "amqptap/jsonl.h"
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

/* ---- what the record stream tells (fed with every record written to --verdicts) ---- */

#define TAP_METRICS_MAX_CODES 16      /* distinct reply codes with their own series; more go to "other" */
#define TAP_METRICS_PROBLEMS 32       /* problem publishes kept for the status page */
#define TAP_METRICS_PROBLEM_BYTES 2048 /* a longer record is kept as a stub with its verdict only */

/* The broker seen at the last connection attempt: an `open` record says it answered, an `unreachable` close that
 * the TCP connection could not be made. */
enum tap_metrics_upstream { TAP_UPSTREAM_UNSEEN, TAP_UPSTREAM_REACHABLE, TAP_UPSTREAM_UNREACHABLE };

struct tap_metrics_problem {
	uint16_t len;
	char json[TAP_METRICS_PROBLEM_BYTES]; /* the publish record as written, or a stub object */
};

struct tap_metrics_tally {
	uint16_t codes[TAP_METRICS_MAX_CODES];
	uint64_t returns_by_code[TAP_METRICS_MAX_CODES];
	size_t n_codes;
	uint64_t returns_other_code;
	uint64_t decode_errors;
	enum tap_metrics_upstream upstream;
	uint64_t problems_seen;                 /* returned, nacked or unknown publishes, ack_before_return included */
	size_t problem_next;                    /* ring position of the next one */
	struct tap_metrics_problem problems[TAP_METRICS_PROBLEMS];
};

/* One settled publish. route and confirm are the record's words ("returned", "nack", ...); json is the record, kept
 * for the status page when the publish is returned, nacked or unknown (NULL or longer than
 * TAP_METRICS_PROBLEM_BYTES: a stub with the verdict is kept). */
struct tap_metrics_verdict {
	const char *route, *confirm;
	size_t route_len, confirm_len;
	uint16_t reply_code; /* of the Return; 0: none */
	const char *json;
	size_t len;
};

/* Known warning rules start at 0 so their series exist before the first one fires. */
void tap_metrics_tally_init(struct tap_metrics_tally *t);
/* One record without its newline, as the tracker or the observer wrote it. A `publish` record costs a backward
 * search of its tail for the verdict (about 80 bytes for a routed one; a problem publish is also copied); other
 * types are rare. */
void tap_metrics_tally_record(struct tap_metrics_tally *t, const char *json, size_t len);
/* What tap_metrics_tally_record does with a `publish` record, for a caller that has the verdict at hand (the
 * tracker's per-publish verdict hook); such a caller must not feed the same publish record again. */
void tap_metrics_tally_verdict(struct tap_metrics_tally *t, const struct tap_metrics_verdict *v);

/* ---- the snapshot a request renders ---- */

/* One output file (--verdicts, --frames, --pcap). */
struct tap_metrics_output {
	bool on;
	uint64_t lines, lost, write_errors; /* lost: dropped whole (backlog full, write failed, not flushed) */
};

enum tap_metrics_out { TAP_METRICS_OUT_VERDICTS, TAP_METRICS_OUT_FRAMES, TAP_METRICS_OUT_PCAP, TAP_METRICS_N_OUT };

struct tap_metrics_snapshot {
	const char *version;
	const char *upstream_name;
	int64_t now_us, start_us;
	bool listening; /* the AMQP listener accepts clients (false while shutting down) */
	/* the tracker (tap_metrics_collect_track) */
	struct tap_track_stats track;
	struct tap_metrics_hist confirm;
	uint64_t confirm_p50_us, confirm_p90_us, confirm_p99_us, confirm_max_us;
	uint64_t channels_open, connections_blocked;
	/* the forwarding engine */
	uint64_t accepted, active, unreachable;
	uint64_t bytes[2]; /* by enum tap_dir */
	struct tap_metrics_output out[TAP_METRICS_N_OUT];
	/* the process (/proc/self); have_process false: not known */
	bool have_process;
	uint64_t rss_bytes, vsize_bytes, open_fds, max_fds;
	double cpu_seconds, start_time_seconds;
	/* the HTTP side itself */
	uint64_t http_open, http_total, http_timeouts, http_paused;
};

/* Fills the tracker's part of s: stats, the confirm histogram, quantiles, open channels and blocked connections. */
void tap_metrics_collect_track(struct tap_metrics_snapshot *s, const struct tap_track *t);

/* The Prometheus text exposition format 0.0.4 (Content-Type: text/plain; version=0.0.4). */
void tap_metrics_render_prometheus(const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t,
                                   struct tap_buf *out);

/* Connection rows /api/status lists at most (the newest); the total is always given. */
#define TAP_METRICS_MAX_ROWS 100

/* The JSON of /api/status: counters, histogram, connections (track may be NULL: none), problem publishes newest
 * first. */
void tap_metrics_render_status(const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t,
                               const struct tap_track *track, struct tap_buf *out);

/* The short JSON of /healthz: listening, uptime, upstream reachable at the last attempt. */
void tap_metrics_render_health(const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t,
                               struct tap_buf *out);

#endif
